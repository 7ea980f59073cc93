"""Convert a transformers-v4 Transformer-XL checkpoint (`model_type: "transfo-xl"`) into a modern `txl` folder.

SOURCE is a v4 folder (a Hub snapshot or a local copy) holding `config.json`, the weights (`model.safetensors`,
`pytorch_model.bin`, or a sharded index of either) and optionally the vocabulary (`vocab.pkl` / `vocab.bin`), or a
Hub repo id, fetched with `huggingface_hub.snapshot_download` (with `HF_HUB_OFFLINE=1`: from the local cache only).
OUT receives a folder that plain transformers v5 loads with `trust_remote_code=True`, and this package natively:
`config.json` (`model_type: "txl"`, `memory_init` "zeros" by default so that outputs equal v4's), the weights under
this package's parameter names, the code files, `tokenizer.json` (when SOURCE has a vocabulary) and a model card.
The checkpoint is loaded through the package, saved, and verified against SOURCE loaded again; OUT is built next to
itself and renamed into place. The same command is installed as `txl-convert`; the logic is `transfoxl.conversion`.

    python scripts/convert.py path/to/transfo-xl-wt103 transfo-xl-wt103-txl
    HF_HUB_OFFLINE=1 python scripts/convert.py transfo-xl/transfo-xl-wt103 transfo-xl-wt103-txl
    python scripts/convert.py SOURCE OUT --memory-init empty --verify-segments 5 --overwrite
"""

from transfoxl.cli.convert import main

if __name__ == "__main__":
    raise SystemExit(main())
