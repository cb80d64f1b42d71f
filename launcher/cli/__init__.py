"""The command layer: Typer commands that parse options and call one function of the core each."""
