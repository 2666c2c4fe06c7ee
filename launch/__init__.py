"""The Hydra side: config schemas, composition of `conf/` into plain dicts, and the command lines."""
