"""The lab's model files are selectable by --model= as the papers' are (configurator.import_model)."""
import configurator


def test_lab_models_are_listed_and_import():
    lab = [p.stem[len('model_'):] for p in (configurator.REPO / 'lab').glob('model_*.py')]
    for name in lab:
        assert name in configurator.available_models()
        assert configurator.import_model(name).__name__ == f'lab.model_{name}'
