"""What several test files share, imported as ``from helpers.<module> import ...`` (pytest puts tests/ on
sys.path): real kernels (kernel.py), JupyterLab and Chromium (browser.py), notebook cells (cells.py), processes
and their checks (processes.py), a local sshd (sshd.py), a two-node Slurm (slurm_cluster.py), and the fixtures
that tests/conftest.py makes available to every test (fixtures.py). A test file imports from here, never from
another test file."""
