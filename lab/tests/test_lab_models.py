"""The lab's model files are selectable by --model= as the papers' are (configurator.import_model)."""
import configurator


def test_lab_models_are_listed_and_import():
    lab = [p.stem[len('model_'):] for p in (configurator.REPO / 'lab').glob('model_*.py')]
    for name in lab:
        assert name in configurator.available_models()
        assert configurator.import_model(name).__name__ == f'lab.model_{name}'


def test_a_checkpoint_with_a_probe_that_moved_to_lab_is_one_line_that_says_where():
    """A checkpoint written while a probe's flag was still in the paper's file names the lab model that holds it
    now; fields no model knows get the plain message."""
    import dataclasses

    import pytest

    import model_infformer
    import runs
    config = dataclasses.asdict(model_infformer.Config(n_layer=1, n_embd=16, n_head=2, d_head=8, d_inner=32))
    ckpt = {'model_name': 'infformer', 'model_config': {**config, 'mu_readout': 'affine'}, 'model': {}}
    with pytest.raises(configurator.UserError, match=r"mu_readout left the paper's file for "
                                                     r"lab/model_infformer_probes\.py: retrain with "
                                                     r"--model=infformer_probes"):
        runs.model_from_checkpoint(ckpt)
    ckpt['model_config'] = {**config, 'no_such_field': 1}
    with pytest.raises(configurator.UserError, match=r"\(written by another version\)$"):
        runs.model_from_checkpoint(ckpt)
