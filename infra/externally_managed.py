"""Exit 0 when pip must not install into this python (PEP 668: an EXTERNALLY-MANAGED marker beside its standard
library, as Debian's and Ubuntu's system python has), 1 otherwise (a virtual environment, pyenv, conda...)."""

import os
import sys
import sysconfig

in_venv = sys.prefix != sys.base_prefix
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if not in_venv and os.path.exists(marker) else 1)
