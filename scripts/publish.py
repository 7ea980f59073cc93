"""Publish a training run on the Hugging Face Hub: the model, its code, the tokenizer, the results and a model card.

RUN_DIR is a folder written by `scripts/train.py` (or any `save_pretrained` folder of a `TxlForCausalLM` with its
tokenizer). The exact folder to commit is built in a staging folder, then uploaded with `huggingface_hub.HfApi`
(`create_repo`, `upload_folder`): one commit, nothing else from RUN_DIR. The same command is installed as
`txl-publish`; the logic is `transfoxl.hub` (and `transfoxl.model_card`), the options `transfoxl.cli.publish`.

    python scripts/publish.py runs/<run> --repo-id my-name/txl-shakespeare --dry-run   # look first, no network
    hf auth login                                                                     # once: a token with write access
    python scripts/publish.py runs/<run> --repo-id my-name/txl-shakespeare            # public, branch main
    python scripts/publish.py runs/<run> --repo-id my-org/txl --private --revision v2 --commit-message "2000 steps"
    python scripts/publish.py runs/<run> --repo-id my-org/txl --create-pr               # open a pull request
    python scripts/publish.py --help

What is committed:

    config.json (with auto_map), model.safetensors, generation_config.json    the model
    configuration_txl.py, modeling_txl.py and the files they import      its code: plain transformers loads it with
                                                                          trust_remote_code
    tokenizer.json, tokenizer_config.json                 AutoTokenizer.from_pretrained(repo_id)
    metrics.json, curves.png, eval/*.json|md|png          the results (scripts/train.py, scripts/evaluate.py)
    training_args.json                                    the run's options, local paths cut to file names
    README.md                                             the model card (YAML metadata with a model-index)

Never committed: `checkpoints/` (optimizer and random states), `logs/`, hidden files, `train_args.json` (it holds
absolute local paths; `training_args.json` is its sanitized copy), nor anything else in RUN_DIR.

`--dry-run` writes that folder to `RUN_DIR/hub-dry-run` (or `--dry-run-dir`, which must be absent or empty), lists
the files and their sizes, and contacts nobody. Without it, the token is `--token`, else huggingface_hub's own
(the `HF_TOKEN` environment variable, else the one `hf auth login` stored); `HF_HUB_OFFLINE=1` refuses before any
request.

After publishing, anyone loads the model by its id:

    AutoModelForCausalLM.from_pretrained("my-name/txl-shakespeare", trust_remote_code=True)  # plain transformers
    AutoModelForCausalLM.from_pretrained("my-name/txl-shakespeare")  # after `import transfoxl`
"""

from transfoxl.cli.publish import main

if __name__ == "__main__":
    raise SystemExit(main())
