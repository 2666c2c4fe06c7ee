"""Text <-> token ids through a Hugging Face `tokenizer.json` (the `tokenizers` library)."""

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from eyas.engine.errors import CheckpointError
from eyas.engine.models.config import read_json

EOS_NAMES = ("</s>", "<|end_of_text|>", "<|eot_id|>", "<|endoftext|>", "<eos>")


class Tokenizer:
    def __init__(self, tokenizer: HFTokenizer, eos_token_ids: tuple[int, ...]):
        self._tok = tokenizer
        self.eos_token_ids = eos_token_ids

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        directory = Path(path)
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise CheckpointError(f"missing file: {file}")
        try:
            tok = HFTokenizer.from_file(str(file))
        except Exception as e:  # the Rust library raises a bare Exception
            raise CheckpointError(f"cannot read {file}: {e}") from e
        return cls(tok, cls._eos_from_files(directory, tok))

    @staticmethod
    def _eos_from_files(directory: Path, tok: HFTokenizer) -> tuple[int, ...]:
        config_file = directory / "tokenizer_config.json"
        if config_file.is_file():
            eos = read_json(config_file).get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str) and tok.token_to_id(eos) is not None:
                return (tok.token_to_id(eos),)
        return tuple(tok.token_to_id(n) for n in EOS_NAMES if tok.token_to_id(n) is not None)[:1]

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def max_token_chars(self) -> int:
        """The most characters one token's text holds (a text of n characters is at least n / this tokens)."""
        if not hasattr(self, "_max_token_chars"):
            self._max_token_chars = max(1, max(map(len, self._tok.get_vocab(with_added_tokens=True))))
        return self._max_token_chars

    def encode(self, text: str) -> list[int]:
        # encode_batch, not encode: it lets go of the GIL while it works, so a long text tokenized in a
        # thread stalls no other thread (encode holds the GIL for as long as it runs)
        return self._tok.encode_batch([text], add_special_tokens=True)[0].ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json holds it."""
        return self._tok.to_str()

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (a piece of a multi-byte character shows as U+FFFD)."""
        return self._tok.decode([token_id], skip_special_tokens=False)
