# nanomem: `make demo` on a fresh machine (no internet needed beyond the package indexes), `make test` for the suite.
PYTHON ?= python3
PIP := $(PYTHON) -m pip install --quiet --disable-pip-version-check

.PHONY: install install-test data demo test fix-copies clean

# torch: keep an installed one; otherwise the default (CUDA) build where nvidia-smi sees a GPU, and where it sees
# none the CPU wheel (~190 MB) from TORCH_INDEX, PyTorch's CPU index: from PyPI alone, Linux gets the CUDA build and
# several GB of nvidia-* wheels. TORCH_INDEX= (empty): pip's own index, for one that serves the CPU wheel itself.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || { \
	  if nvidia-smi -L >/dev/null 2>&1; then $(PIP) torch; \
	  else $(PIP) torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); fi; }
	@$(PIP) -r requirements.txt

# triton: a CUDA torch brings its own; on a CPU machine the tests run rel_attention_triton.py's kernels under
# Triton's interpreter, which needs 3.8 (3.6's fails on them).
install-test: install
	@$(PIP) -r requirements-test.txt
	@nvidia-smi -L >/dev/null 2>&1 || $(PIP) triton==3.8.0

data: install
	$(PYTHON) data/gutenberg/prepare.py

demo: data
	$(PYTHON) train.py config/xl_demo.py
	$(PYTHON) sample.py --out_dir=out-demo --start="ROMEO. " --max_new_tokens=200 --seed=1

# one test worker a core (pytest-xdist), at most TEST_WORKERS: the subprocess tests start 2 more processes each;
# worksteal: an idle worker takes tests queued on a busy one (the longest tests would otherwise end the run alone)
TEST_WORKERS ?= 4
test: install-test
	$(PYTHON) -m pytest -q -n auto --maxprocesses=$(TEST_WORKERS) --dist=worksteal tests lab/tests

# after a change to a block other model files copy (`# Copied from`): rewrite the copies from it (tests/_copies.py)
fix-copies:
	$(PYTHON) tests/_copies.py --fix

clean:
	rm -rf out-demo
