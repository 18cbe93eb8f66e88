"""llama.cpp's convert_hf_to_gguf.py, run as it is, with one decision made by relctl instead of a hash table.

The converter names a BPE tokenizer's pre-tokenizer (`tokenizer.ggml.pre`) by hashing the token ids of a
fixed string and looking the hash up in a table of published models; a tokenizer trained for a run (the
example's) is in no table, and the converter refuses it. relctl reads the pre-tokenizer from tokenizer.json
instead (release/backends/llama_cpp/export.py: `pre_tokenizer_of`) and passes its llama.cpp name here; it is
used only when the hash is unknown, and validation's tokenizer-parity check proves the choice on the run's
prompts and edge strings. Run by relctl's python as a script: `run_converter.py CONVERTER_DIR PRE ARGS...`
(PRE "" keeps the converter's refusal). A second, mechanical patch: see `create_vocab_sentencepiece`.
"""

from __future__ import annotations

import importlib
import runpy
import sys
from typing import Any


def main(argv: list[str]) -> None:
    converter_dir, pre, args = argv[1], argv[2], argv[3:]
    sys.path[:0] = [converter_dir, f"{converter_dir}/gguf-py"]
    # The converter's own module object: the script run below imports this same one, so the patch holds.
    text_model: Any = importlib.import_module("conversion.base").TextModel
    known = text_model.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            name: str = known(self, tokenizer)
            return name
        except NotImplementedError:
            if not pre:
                raise
            print(f"relctl: pre-tokenizer hash not in this converter's table; tokenizer.json's pre-tokenizer is "
                  f"llama.cpp's '{pre}'", file=sys.stderr)
            return pre

    text_model.get_vocab_base_pre = get_vocab_base_pre

    # The SentencePiece path imports sentencepiece before it looks for tokenizer.model; relctl's environment
    # has no sentencepiece (a tokenizer.json-only checkpoint needs none), so the missing file is reported
    # first, as the converter itself would after the import, and it moves on to the tokenizer.json paths.
    sentencepiece = text_model._create_vocab_sentencepiece

    def create_vocab_sentencepiece(self: Any) -> Any:
        if not (self.dir_model / "tokenizer.model").is_file():
            raise FileNotFoundError(f"File not found: {self.dir_model / 'tokenizer.model'}")
        return sentencepiece(self)

    text_model._create_vocab_sentencepiece = create_vocab_sentencepiece
    sys.argv = [f"{converter_dir}/convert_hf_to_gguf.py", *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv)
