"""paramiko, imported without invoke where nothing needs it.

paramiko's config module imports invoke at once, for one thing only: running an ssh config's `Match exec`
command. Its import (YAML, terminal and test modules among them) is about a third of paramiko's own, paid on every
launch. Here paramiko is imported with invoke held back (paramiko then treats it as absent, as it allows), and
`config_lookup` imports it the first time a config really has a `Match exec` to run. Where paramiko or invoke is
already imported (a program that embeds the launcher), nothing is held back.
"""

import sys

if "paramiko" not in sys.modules and "invoke" not in sys.modules:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` raises ImportError meanwhile
    try:
        import paramiko
    finally:
        del sys.modules["invoke"]

import paramiko as paramiko  # noqa: E402, PLC0414 - the one import of paramiko the launcher's modules use
import paramiko.config  # noqa: E402


def config_lookup(config: paramiko.SSHConfig, hostname: str) -> paramiko.SSHConfigDict:
    """`config.lookup(hostname)`, importing invoke first when the config has a `Match exec` to run."""
    try:
        return config.lookup(hostname)
    except ImportError:  # paramiko's "cannot import invoke", raised at a `Match exec` only
        if getattr(paramiko.config, "invoke", None) is not None:
            raise
        import invoke

        setattr(paramiko.config, "invoke", invoke)  # noqa: B010 - what paramiko's own import sets (not in its stubs)
        return config.lookup(hostname)
