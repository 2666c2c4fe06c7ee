"""dependency-injector containers: what gets built from the composed config."""
