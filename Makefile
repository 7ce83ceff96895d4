# The two commands of the README's quick start.
.PHONY: run test lint

# The main job: exporter + shipper in one process, archive sink by default.
# On a machine without an NVIDIA GPU it stops with a clear message and the simulator
# command to use instead (it never fakes data by itself). Extra options: ARGS="...".
# gpu-audit's hints say `make run ARGS="..."` when it runs from here (gpu_audit/invocation.py).
run: export GPU_AUDIT_VIA_MAKE_RUN = 1
run:
	@scripts/setup
	.venv/bin/gpu-audit run $(ARGS)

# Everything the tests need (apt servers, venv, project), then lint, types, the layer
# contracts (import-linter, pyproject.toml) and tests.
test:
	@scripts/setup --test
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/lint-imports --no-logo
	.venv/bin/python -m pytest $(PYTEST_ARGS)

lint:
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/lint-imports --no-logo
