# Sourced by infra/setup.sh and infra/test.sh: `py` names the python that gets ddpctl and runs the tests.
# python3 itself, or the virtual environment .venv where pip may not install into python3: Debian's and Ubuntu's
# system python is "externally managed" (PEP 668), and a minimal one has no pip.
if python3 -m pip --version >/dev/null 2>&1 && ! python3 infra/externally_managed.py; then
  py=python3
else
  py=.venv/bin/python
fi
