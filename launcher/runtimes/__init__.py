"""How a node runs: native torchrun on the host, or a Docker container; each turns a node's plan into what starts,
stops and is shipped."""
