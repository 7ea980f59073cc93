"""`txl-publish` (scripts/publish.py): a run folder to the Hugging Face Hub, or with --dry-run to a local folder.

The logic is `transfoxl.hub`; this module parses and checks the options and orders the work: read the run folder,
write the folder to commit (the dry run's destination, or a hidden staging folder), upload it in one commit.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from .. import hub
from ..model_card import UNKNOWN_LICENSE
from ..runs import RunFolderError
from .options import path_argument, program_name

# The code files committed with the model are this package's, under its licence: the default for the repository.
DEFAULT_LICENSE = "apache-2.0"
LICENSE_ID = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name("publish.py"),
        description="Publish a scripts/train.py run folder, or a folder made by scripts/convert.py, on the Hugging "
        "Face Hub (model, code, tokenizer, results and a generated model card).",
    )
    parser.add_argument(
        "run_dir",
        type=path_argument,
        metavar="RUN_DIR",
        help="the run folder (scripts/train.py --output-dir) or a converted one (scripts/convert.py OUT)",
    )
    parser.add_argument("--repo-id", required=True, help="the model repository, namespace/name (e.g. my-name/txl)")
    hub_options = parser.add_argument_group("Hub")
    hub_options.add_argument(
        "--private", action="store_true", help="create the repository private (an existing one keeps its visibility)"
    )
    hub_options.add_argument(
        "--revision", default=None, help="the branch to commit to (default: main; created from main when missing)"
    )
    hub_options.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing")
    hub_options.add_argument(
        "--commit-message", default=None, help="(default: Upload <RUN_DIR name> with scripts/publish.py)"
    )
    hub_options.add_argument("--token", default=None, help="a write token (default: HF_TOKEN, else `hf auth login`'s)")
    card = parser.add_argument_group("model card")
    card.add_argument(
        "--license",
        default=None,
        help="a Hub licence id, e.g. mit (default: that of the converted checkpoint or the fine-tuned base model, "
        f"else {DEFAULT_LICENSE})",
    )
    card.add_argument(
        "--dataset",
        nargs="+",
        default=None,
        metavar="NAME",
        help="Hub dataset ids for the card's `datasets` (default: the run's --dataset-name; none for local files)",
    )
    card.add_argument(
        "--include-mismatched-eval",
        action="store_true",
        help="publish eval/ reports made with another tokenizer or on other text than the run's (refused without "
        "it), each marked as such on the card",
    )
    dry = parser.add_argument_group("dry run")
    dry.add_argument("--dry-run", action="store_true", help="write the folder that would be committed; no network")
    dry.add_argument("--dry-run-dir", type=path_argument, default=None, help="where (default: RUN_DIR/hub-dry-run)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse and check the options that need no file: repository and dataset ids, licence, option combinations."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        validate_repo_id(args.repo_id)
    except HFValidationError as error:
        parser.error(f"--repo-id {args.repo_id!r}: expected namespace/name ({error})")
    if "/" not in args.repo_id:
        # Without a namespace the Hub puts the model under the token's user; say it, so that the card's id is right.
        parser.error(f"--repo-id {args.repo_id!r}: expected namespace/name, e.g. your-user-name/{args.repo_id}")
    for name in args.dataset or []:
        try:
            validate_repo_id(name)
        except HFValidationError as error:
            parser.error(f"--dataset {name!r}: expected a Hub dataset id such as Salesforce/wikitext ({error})")
    if args.license is not None and not LICENSE_ID.match(args.license):
        parser.error(f"--license {args.license!r}: expected a Hub licence id such as mit, apache-2.0 or other")
    if args.dry_run_dir is not None and not args.dry_run:
        parser.error("--dry-run-dir needs --dry-run")
    if args.revision is not None and not args.revision.strip():
        parser.error("--revision: expected a branch name")
    if args.commit_message is not None and not args.commit_message.strip():
        parser.error("--commit-message: expected a message (leave the option out for the default one)")
    return parser, args


def choose_license(given: str | None, publication: hub.Publication) -> str:
    """--license, else the licence declared for what the folder derives from (a converted checkpoint's source, a
    fine-tuned base model; said), else the default."""
    if given is not None:
        return given
    declared, derived = publication.source_license, publication.derived
    if declared == UNKNOWN_LICENSE:  # a Hub base model whose card this machine does not hold: never guessed
        raise ValueError(
            f"{derived} ({publication.base['hub_id']}) has a licence this machine cannot read (its card is not in "
            "the local Hub cache): pass --license, that model's licence or one its terms allow"
        )
    if isinstance(declared, str) and LICENSE_ID.match(declared):
        print(f"licence: {declared}, {derived}'s own (--license to choose another)")
        return declared
    if derived is not None:
        if declared is None:
            declares = "no licence:"
        elif isinstance(declared, list):
            declares = f"several licences ({', '.join(declared)}): pass --license to choose one;"
        else:
            declares = f"the licence {declared!r}, not a Hub licence id:"
        print(f"WARNING: {derived} declares {declares} {DEFAULT_LICENSE} (--license to choose)")
    return DEFAULT_LICENSE


def human_size(size: float) -> str:
    for unit in ("B", "kB", "MB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def print_listing(folder: Path) -> None:
    listing = hub.folder_listing(folder)
    for name, size in listing:
        print(f"  {human_size(size):>10}  {name}")
    print(f"  {human_size(sum(size for _, size in listing)):>10}  in {len(listing)} files")


def main(argv: Sequence[str] | None = None) -> int:
    parser, args = parse_args(argv)
    try:
        publication = hub.read_run_folder(args.run_dir)
    except RunFolderError as error:
        parser.error(str(error))
    for warning in publication.warnings:
        print(f"WARNING: {warning}")
    if publication.eval_mismatches and not args.include_mismatched_eval:
        parser.error(hub.mismatched_reports_message(publication))
    for name, why in sorted(publication.eval_mismatches.items()):
        print(f"WARNING: {name} is published marked on the card as not this run's evaluation: {why}")
    try:
        license_id = choose_license(args.license, publication)
    except ValueError as error:
        parser.error(str(error))
    if (warning := hub.license_warning(license_id)) is not None:
        print(f"WARNING: {warning}")

    def build(folder: Path, *, link: bool = False) -> None:
        hub.write_hub_folder(publication, folder, args.repo_id, license_id, args.dataset, link=link)

    target = f"{args.repo_id} (revision {args.revision or 'main'}{', pull request' if args.create_pr else ''})"
    try:
        if args.dry_run:
            destination = args.dry_run_dir if args.dry_run_dir is not None else args.run_dir / "hub-dry-run"
            hub.write_dry_run_folder(build, destination)
            print(f"dry run, nothing uploaded: a commit to {target} would hold")
            print_listing(destination)
            print(f"written to {destination}")
            return 0
        # Checked before anything is built or sent: a refusal costs nothing.
        if hub.offline_mode():
            raise hub.PublishError(
                "Offline mode is on (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set): publishing needs the network. "
                "Unset them, or use --dry-run to write the folder without uploading it."
            )
        token = hub.resolve_token(args.token)
        staging_root = hub.upload_staging_root(args.run_dir)
        with tempfile.TemporaryDirectory(prefix=".staging-publish-", dir=staging_root) as staging:
            folder = Path(staging) / "repo"
            folder.mkdir()
            build(folder, link=True)  # hard links: the folder is only read
            print(f"uploading to {target}{' (private)' if args.private else ''}:")
            print_listing(folder)
            repo_url, commit = hub.upload(
                folder,
                repo_id=args.repo_id,
                token=token,
                commit_message=args.commit_message or f"Upload {args.run_dir.resolve().name} with scripts/publish.py",
                private=args.private,
                revision=args.revision,
                create_pr=args.create_pr,
            )
    except hub.PublishError as error:
        raise SystemExit(str(error)) from None
    print(f"repository: {repo_url}")
    if getattr(commit, "pr_url", None):
        print(f"pull request: {commit.pr_url}")
    print(f"commit: {commit.commit_url}")
    return 0
