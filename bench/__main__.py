"""`python -m eyas.bench <subcommand> [options]`: every benchmark of eyas, one per subcommand. Each writes
`<--out>/<subcommand>.json` (command, host, table, results; `python -m eyas.engine.report <--out>` makes
report.md of them) and prints ratios measured in its own run."""

import sys
from importlib import import_module

SUBCOMMANDS = {
    "decode": "plain decoding: eyas against transformers' generate on a random checkpoint",
    "spec": "speculative against plain decoding per step count and tree shape, with each phase's time and floor",
    "adaptive": "adaptive speculation against every fixed step count and plain decoding on a mixed workload",
    "sampled": "speculation when requests sample, in both verify modes",
    "structured": "speculation under a JSON schema, drafts masked and not; --mask-cost times the grammar engines",
    "prefix": "two servers, prefix cache on and off: time to first token of shared prefixes and multi-turn chats",
    "serve": "the server under load against transformers serve: throughput, TTFT and TPOT by request rate",
    "replicas": "Ray Serve replicas: prefix-aware against round-robin routing on shared system prompts, by streams",
    "peers": "eyas's systems against llama.cpp, CTranslate2 and transformers on held-out prompts, interleaved",
    "quant": "weight formats: decode speed at a real model's shape, and each format's quality",
    "layouts": "the tiny target's fused projections in every float32 weight layout, timed alone",
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, summary in SUBCOMMANDS.items()]
    return "usage: python -m eyas.bench <subcommand> [--help] [options]\n\nsubcommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"python -m eyas.bench: unknown subcommand {name!r}; allowed: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    import_module(f"eyas.bench.{name}").main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
