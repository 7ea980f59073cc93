"""Train a tiny character-level Transformer-XL on a built-in text and show what its memory does.

This is the package's end-to-end demo: no download, no argument needed, about half a minute on two CPU cores. It

1. builds a character vocabulary from a few public-domain poems stored in this file (Shakespeare's sonnets and
   Shelley's "Ozymandias") and splits the characters 90/10 into a training and a validation stream;
2. lays the training stream out the Transformer-XL way with the package's `transfoxl.data.StreamBatcher`
   (`batch_size` contiguous columns, read segment after segment so the memory of one segment is the true left context
   of the next, targets shifted across segment edges);
3. trains a small `TxlForCausalLM` for a fixed number of steps, carrying the memory from step to step;
4. measures validation bits per character (bpc) without memory, with the training memory length and with a longer
   evaluation memory: the memory is what lets Transformer-XL see past the segment boundary, so bpc goes down;
5. samples a short continuation of the validation text, starting from the memory of that text.

From the repository root:

    python scripts/demo.py                                  # defaults: about 25 s on 2 idle CPU cores
    python scripts/demo.py --steps 50 --sample-len 50       # a quick smoke run
    python scripts/demo.py --mem-len 0 --eval-mem-len 256   # train without memory, evaluate with one
    python scripts/demo.py --out runs/demo                  # also save the model, vocab.json and metrics.json
    python scripts/demo.py --help

The text is tiny (8.8k characters), so more steps or a wider model overfit: validation bpc bottoms out near 3.0 with
the defaults while the training bpc keeps falling. The point is the comparison between the rows of the table.

On a machine whose cores are busy with other work, torch's multi-threaded CPU kernels can slow down tenfold;
`OMP_NUM_THREADS=1 python scripts/demo.py` is then the faster choice (about 35 s idle instead of about 25 s).

A model saved with `--out` reloads with `import transfoxl; AutoModelForCausalLM.from_pretrained("runs/demo")`;
`vocab.json` there maps token ids to characters.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from transfoxl import TxlConfig, TxlForCausalLM, TxlMemory
from transfoxl.data import StreamBatcher

# Public domain: William Shakespeare, Sonnets (1609), and Percy Bysshe Shelley, "Ozymandias" (1818).
CORPUS = """\
SONNET I

From fairest creatures we desire increase,
That thereby beauty's rose might never die,
But as the riper should by time decease,
His tender heir might bear his memory:
But thou, contracted to thine own bright eyes,
Feed'st thy light's flame with self-substantial fuel,
Making a famine where abundance lies,
Thyself thy foe, to thy sweet self too cruel.
Thou that art now the world's fresh ornament
And only herald to the gaudy spring,
Within thine own bud buriest thy content
And, tender churl, makest waste in niggarding.
Pity the world, or else this glutton be,
To eat the world's due, by the grave and thee.

SONNET XII

When I do count the clock that tells the time,
And see the brave day sunk in hideous night;
When I behold the violet past prime,
And sable curls all silver'd o'er with white;
When lofty trees I see barren of leaves,
Which erst from heat did canopy the herd,
And summer's green all girded up in sheaves,
Borne on the bier with white and bristly beard,
Then of thy beauty do I question make,
That thou among the wastes of time must go,
Since sweets and beauties do themselves forsake
And die as fast as they see others grow;
And nothing 'gainst Time's scythe can make defence
Save breed, to brave him when he takes thee hence.

SONNET XVIII

Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall Death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.

SONNET XXIX

When, in disgrace with fortune and men's eyes,
I all alone beweep my outcast state,
And trouble deaf heaven with my bootless cries,
And look upon myself and curse my fate,
Wishing me like to one more rich in hope,
Featured like him, like him with friends possess'd,
Desiring this man's art and that man's scope,
With what I most enjoy contented least;
Yet in these thoughts myself almost despising,
Haply I think on thee, and then my state,
Like to the lark at break of day arising
From sullen earth, sings hymns at heaven's gate;
For thy sweet love remember'd such wealth brings
That then I scorn to change my state with kings.

SONNET XXX

When to the sessions of sweet silent thought
I summon up remembrance of things past,
I sigh the lack of many a thing I sought,
And with old woes new wail my dear time's waste:
Then can I drown an eye, unused to flow,
For precious friends hid in death's dateless night,
And weep afresh love's long since cancell'd woe,
And moan the expense of many a vanish'd sight:
Then can I grieve at grievances foregone,
And heavily from woe to woe tell o'er
The sad account of fore-bemoaned moan,
Which I new pay as if not paid before.
But if the while I think on thee, dear friend,
All losses are restored and sorrows end.

SONNET XXXIII

Full many a glorious morning have I seen
Flatter the mountain-tops with sovereign eye,
Kissing with golden face the meadows green,
Gilding pale streams with heavenly alchemy;
Anon permit the basest clouds to ride
With ugly rack on his celestial face,
And from the forlorn world his visage hide,
Stealing unseen to west with this disgrace:
Even so my sun one early morn did shine
With all-triumphant splendour on my brow;
But out, alack! he was but one hour mine;
The region cloud hath mask'd him from me now.
Yet him for this my love no whit disdaineth;
Suns of the world may stain when heaven's sun staineth.

OZYMANDIAS

I met a traveller from an antique land
Who said: Two vast and trunkless legs of stone
Stand in the desert. Near them, on the sand,
Half sunk, a shattered visage lies, whose frown,
And wrinkled lip, and sneer of cold command,
Tell that its sculptor well those passions read
Which yet survive, stamped on these lifeless things,
The hand that mocked them and the heart that fed:
And on the pedestal these words appear:
"My name is Ozymandias, king of kings:
Look on my works, ye Mighty, and despair!"
Nothing beside remains. Round the decay
Of that colossal wreck, boundless and bare
The lone and level sands stretch far away.

SONNET LV

Not marble, nor the gilded monuments
Of princes, shall outlive this powerful rhyme;
But you shall shine more bright in these contents
Than unswept stone, besmear'd with sluttish time.
When wasteful war shall statues overturn,
And broils root out the work of masonry,
Nor Mars his sword nor war's quick fire shall burn
The living record of your memory.
'Gainst death and all-oblivious enmity
Shall you pace forth; your praise shall still find room
Even in the eyes of all posterity
That wear this world out to the ending doom.
So, till the judgment that yourself arise,
You live in this, and dwell in lovers' eyes.

SONNET LX

Like as the waves make towards the pebbled shore,
So do our minutes hasten to their end;
Each changing place with that which goes before,
In sequent toil all forwards do contend.
Nativity, once in the main of light,
Crawls to maturity, wherewith being crown'd,
Crooked eclipses 'gainst his glory fight,
And Time that gave doth now his gift confound.
Time doth transfix the flourish set on youth
And delves the parallels in beauty's brow,
Feeds on the rarities of nature's truth,
And nothing stands but for his scythe to mow:
And yet to times in hope my verse shall stand,
Praising thy worth, despite his cruel hand.

SONNET LXV

Since brass, nor stone, nor earth, nor boundless sea,
But sad mortality o'er-sways their power,
How with this rage shall beauty hold a plea,
Whose action is no stronger than a flower?
O, how shall summer's honey breath hold out
Against the wrackful siege of battering days,
When rocks impregnable are not so stout,
Nor gates of steel so strong, but Time decays?
O fearful meditation! where, alack,
Shall Time's best jewel from Time's chest lie hid?
Or what strong hand can hold his swift foot back?
Or who his spoil of beauty can forbid?
O, none, unless this miracle have might,
That in black ink my love may still shine bright.

SONNET LXXI

No longer mourn for me when I am dead
Than you shall hear the surly sullen bell
Give warning to the world that I am fled
From this vile world, with vilest worms to dwell:
Nay, if you read this line, remember not
The hand that writ it; for I love you so
That I in your sweet thoughts would be forgot
If thinking on me then should make you woe.
O, if, I say, you look upon this verse
When I perhaps compounded am with clay,
Do not so much as my poor name rehearse.
But let your love even with my life decay,
Lest the wise world should look into your moan
And mock you with me after I am gone.

SONNET LXXIII

That time of year thou mayst in me behold
When yellow leaves, or none, or few, do hang
Upon those boughs which shake against the cold,
Bare ruin'd choirs, where late the sweet birds sang.
In me thou see'st the twilight of such day
As after sunset fadeth in the west,
Which by and by black night doth take away,
Death's second self, that seals up all in rest.
In me thou see'st the glowing of such fire
That on the ashes of his youth doth lie,
As the death-bed whereon it must expire,
Consumed with that which it was nourish'd by.
This thou perceivest, which makes thy love more strong,
To love that well which thou must leave ere long.

SONNET CXVI

Let me not to the marriage of true minds
Admit impediments. Love is not love
Which alters when it alteration finds,
Or bends with the remover to remove:
O no; it is an ever-fixed mark,
That looks on tempests and is never shaken;
It is the star to every wandering bark,
Whose worth's unknown, although his height be taken.
Love's not Time's fool, though rosy lips and cheeks
Within his bending sickle's compass come;
Love alters not with his brief hours and weeks,
But bears it out even to the edge of doom.
If this be error and upon me proved,
I never writ, nor no man ever loved.

SONNET CXXX

My mistress' eyes are nothing like the sun;
Coral is far more red than her lips' red;
If snow be white, why then her breasts are dun;
If hairs be wires, black wires grow on her head.
I have seen roses damask'd, red and white,
But no such roses see I in her cheeks;
And in some perfumes is there more delight
Than in the breath that from my mistress reeks.
I love to hear her speak, yet well I know
That music hath a far more pleasing sound;
I grant I never saw a goddess go;
My mistress, when she walks, treads on the ground:
And yet, by heaven, I think my love as rare
As any she belied with false compare.
"""

VALID_FRACTION = 0.1
N_HEAD = 4
D_INNER_MULTIPLIER = 4  # d_inner = 4 * d_model, the usual ratio: 256 for the default width
WARMUP_FRACTION = 0.1
MAX_GRAD_NORM = 0.25  # the original Transformer-XL code's clip value
DROPOUT = 0.1
SEGMENT_START = 8  # the first positions of a segment: without memory they have almost no context
TOP_K = 10
TEMPERATURE = 0.8


# ---------------------------------------------------------------------------------------------------------------------
# Data: characters -> ids (the Transformer-XL ordered segments come from transfoxl.data.StreamBatcher)


def build_vocab(text: str) -> list[str]:
    """The sorted set of the characters of `text`: token id `i` is character `vocab[i]`."""
    return sorted(set(text))


def encode(text: str, vocab: Sequence[str]) -> torch.Tensor:
    """Characters -> a 1-D int64 tensor of token ids."""
    index = {char: i for i, char in enumerate(vocab)}
    return torch.tensor([index[char] for char in text], dtype=torch.long)


def decode(ids: Sequence[int] | torch.Tensor, vocab: Sequence[str]) -> str:
    """Token ids -> characters."""
    return "".join(vocab[int(i)] for i in ids)


# ---------------------------------------------------------------------------------------------------------------------
# Model, training, evaluation, sampling


def build_model(vocab_size: int, args: argparse.Namespace) -> TxlForCausalLM:
    """A small seeded character-level Transformer-XL (plain softmax: a character vocabulary needs no clusters)."""
    torch.manual_seed(args.seed)
    config = TxlConfig(
        vocab_size=vocab_size,
        cutoffs=[],
        div_val=1,
        d_model=args.d_model,
        n_head=N_HEAD,
        d_head=args.d_model // N_HEAD,
        d_inner=D_INNER_MULTIPLIER * args.d_model,
        n_layer=args.n_layer,
        mem_len=args.mem_len,
        tgt_len=args.tgt_len,
        clamp_len=-1,
        same_length=False,
        dropout=DROPOUT,
        eos_token_id=None,  # a character-level stream has no end-of-sequence token
    )
    return TxlForCausalLM(config)


def bits(nats: float) -> float:
    return nats / math.log(2)


def train(model: TxlForCausalLM, batcher: StreamBatcher, args: argparse.Namespace) -> dict[str, float]:
    """Train for `args.steps` segments in stream order, carrying the memory; returns the final loss and throughput.

    The reported loss is a running average (0.9 decay) of the per-step losses, as shown in the progress bar.
    """
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup_steps = max(1, int(WARMUP_FRACTION * args.steps))
    scheduler = get_cosine_schedule_with_warmup(optimizer, warmup_steps, args.steps)
    memory = TxlMemory.from_config(model.config)
    tokens_seen, smoothed_loss = 0, None
    start = time.perf_counter()
    progress = tqdm(range(args.steps), desc="train", unit="step", dynamic_ncols=True)
    for _ in progress:
        inputs, targets = batcher.next_batch()
        if batcher.position == 1 and batcher.epoch > 0:
            # The stream wrapped around: the first segment is not the continuation of the last one, so the
            # memory of the end of the text must not be its context.
            memory.reset()
        output = model(inputs, past_key_values=memory, shift_labels=targets)
        output.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        loss = output.loss.item()
        smoothed_loss = loss if smoothed_loss is None else 0.9 * smoothed_loss + 0.1 * loss
        tokens_seen += targets.numel()
        tokens_per_second = tokens_seen / (time.perf_counter() - start)
        progress.set_postfix(
            loss=f"{smoothed_loss:.3f}", bpc=f"{bits(smoothed_loss):.3f}", tok_s=f"{tokens_per_second:.0f}"
        )
    progress.close()
    seconds = time.perf_counter() - start
    return {
        "train_loss": smoothed_loss,
        "train_bpc": bits(smoothed_loss),
        "train_seconds": seconds,
        "train_tokens_per_second": tokens_seen / seconds,
    }


@torch.no_grad()
def evaluate_bpc(model: TxlForCausalLM, stream: torch.Tensor, tgt_len: int, mem_len: int) -> dict[str, float]:
    """Bits per character of `stream` `[N]`, read in segments of `tgt_len` with a memory of `mem_len` (0: none).

    Returns `{"all": bpc of every target, "segment_start": bpc of the first SEGMENT_START targets of each segment}`.
    Every mode scores the same N - 1 targets, so the numbers are comparable: only the context differs.
    """
    model.eval()
    # A fresh memory of any length works with a trained model: it holds states, not parameters.
    memory = TxlMemory(num_layers=model.config.n_layer, mem_len=mem_len) if mem_len > 0 else None
    total_nll = start_nll = 0.0
    total_count = start_count = 0
    for inputs, targets in StreamBatcher(stream, batch_size=1, tgt_len=tgt_len):
        output = model(inputs, past_key_values=memory, shift_labels=targets, use_cache=memory is not None)
        total_nll += output.losses.sum().item()
        total_count += targets.numel()
        start_nll += output.losses[:, :SEGMENT_START].sum().item()
        start_count += targets[:, :SEGMENT_START].numel()
    return {"all": bits(total_nll / total_count), "segment_start": bits(start_nll / start_count)}


@torch.no_grad()
def sample(
    model: TxlForCausalLM, context: torch.Tensor, tgt_len: int, mem_len: int, max_new_tokens: int, seed: int
) -> torch.Tensor:
    """Continue `context` `[N]`: stream it into a memory of `mem_len`, then sample `max_new_tokens` new token ids.

    The memory holds every token fed to the model, and generate() feeds its prompt again, so the prompt must be
    only what the memory has not seen: all but the last token go through the memory, the last one is the prompt.
    """
    model.eval()
    memory = TxlMemory(num_layers=model.config.n_layer, mem_len=mem_len)
    for start in range(0, context.numel() - 1, tgt_len):
        segment = context[start : min(start + tgt_len, context.numel() - 1)]
        model(segment[None], past_key_values=memory, logits_to_keep=1)  # only the memory is wanted
    torch.manual_seed(seed)
    output = model.generate(
        context[-1:][None],
        past_key_values=memory,
        do_sample=True,
        top_k=TOP_K,
        temperature=TEMPERATURE,
        max_new_tokens=max_new_tokens,
    )
    return output[0, 1:]  # generate returns the prompt too


# ---------------------------------------------------------------------------------------------------------------------
# Output files


def write_json_atomically(path: Path, data: Any) -> None:
    """Write `data` as JSON to a temporary file next to `path`, then rename: readers never see a partial file."""
    tmp_path = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # same folder, so os.replace is an atomic rename
    try:
        with open(tmp_path, "x", encoding="utf-8") as file:  # created with the usual permissions (umask)
            json.dump(data, file, indent=2, ensure_ascii=False)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def save_model_atomically(model: TxlForCausalLM, out: Path) -> None:
    """`save_pretrained` into a staging folder inside `out`, then move each file into place with `os.replace`."""
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".save-"))
    try:
        model.save_pretrained(staging)
        for item in staging.iterdir():
            os.replace(item, out / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str] | None, train_len: int, valid_len: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a tiny character-level Transformer-XL on a built-in text and compare validation bits per "
        "character without memory, with the training memory and with a longer evaluation memory.",
    )
    parser.add_argument(
        "--steps", type=int, default=400, help="optimizer steps, one segment each (default: %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, help="contiguous columns of the training stream (default: %(default)s)"
    )
    parser.add_argument("--tgt-len", type=int, default=64, help="segment length in characters (default: %(default)s)")
    parser.add_argument(
        "--mem-len", type=int, default=128, help="memory length while training, 0 for none (default: %(default)s)"
    )
    parser.add_argument(
        "--eval-mem-len", type=int, default=None, help="memory length of the third evaluation (default: 4 * --mem-len)"
    )
    parser.add_argument(
        "--d-model", type=int, default=64, help=f"model width, a multiple of {2 * N_HEAD} (default: %(default)s)"
    )
    parser.add_argument("--n-layer", type=int, default=3, help="number of layers (default: %(default)s)")
    parser.add_argument(
        "--lr",
        type=float,
        default=3e-3,
        help="peak learning rate, linear warmup and cosine decay (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the initialisation, dropout and sampling (default: %(default)s)"
    )
    parser.add_argument(
        "--sample-len",
        type=int,
        default=200,
        help="characters to generate at the end, 0 for none (default: %(default)s)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="folder to save the model, vocab.json and metrics.json in (optional)"
    )
    args = parser.parse_args(argv)

    if args.eval_mem_len is None:
        args.eval_mem_len = 4 * args.mem_len
    for name in ("steps", "batch_size", "tgt_len", "n_layer"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("mem_len", "eval_mem_len", "sample_len"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    # d_head = d_model / n_head, and the sinusoidal position encoding needs an even width.
    if args.d_model < 2 * N_HEAD or args.d_model % (2 * N_HEAD):
        parser.error(f"--d-model must be a positive multiple of {2 * N_HEAD}, got {args.d_model}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr must be a positive number, got {args.lr}")
    if args.tgt_len >= valid_len:
        parser.error(
            f"--tgt-len {args.tgt_len} is too long: the validation stream has {valid_len} characters "
            f"(at most {valid_len - 1} targets); use a --tgt-len below {valid_len}"
        )
    column_len = train_len // args.batch_size
    if args.tgt_len >= column_len:
        parser.error(
            f"--tgt-len {args.tgt_len} with --batch-size {args.batch_size} does not fit: each of the "
            f"{args.batch_size} training columns holds {column_len} characters; lower --tgt-len or --batch-size"
        )
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a folder")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    vocab = build_vocab(CORPUS)
    data = encode(CORPUS, vocab)
    split = int(len(data) * (1 - VALID_FRACTION))
    # Split by position, not at random: the validation text is text the model never saw, read in order.
    train_stream, valid_stream = data[:split], data[split:]
    args = parse_args(argv, train_len=len(train_stream), valid_len=len(valid_stream))

    train_batcher = StreamBatcher(train_stream, args.batch_size, args.tgt_len)
    model = build_model(len(vocab), args)
    n_params = sum(parameter.numel() for parameter in model.parameters())
    print(
        f"corpus: {len(CORPUS)} characters, vocabulary {len(vocab)}; train {len(train_stream)} "
        f"({args.batch_size} columns of {train_batcher.column_len}, {len(train_batcher)} segments per pass), "
        f"validation {len(valid_stream)}"
    )
    print(
        f"model: {args.n_layer} layers, d_model {args.d_model}, {n_params / 1e3:.0f}k parameters; "
        f"tgt_len {args.tgt_len}, mem_len {args.mem_len}; {args.steps} steps"
    )

    metrics: dict[str, Any] = train(model, train_batcher, args)

    modes = [
        ("no_memory", "none (each segment alone)", 0),
        ("train_memory", f"memory {args.mem_len} (training length)", args.mem_len),
        ("long_memory", f"memory {args.eval_mem_len} (evaluation only)", args.eval_mem_len),
    ]
    results = {key: evaluate_bpc(model, valid_stream, args.tgt_len, mem_len) for key, _, mem_len in modes}
    width = max(len(label) for _, label, _ in modes)
    start = min(SEGMENT_START, args.tgt_len)
    print(f"\nvalidation bits per character ({len(valid_stream) - 1} characters, segments of {args.tgt_len}):")
    print(f"  {'context':<{width}}  {'all':>6}  {f'first {start} of each segment':>26}")
    for key, label, _ in modes:
        print(f"  {label:<{width}}  {results[key]['all']:6.3f}  {results[key]['segment_start']:26.3f}")

    text_sample = ""
    if args.sample_len > 0:
        # The sample continues the validation text from a memory of it (at least one segment long).
        sample_mem_len = max(args.eval_mem_len, args.tgt_len)
        new_ids = sample(model, valid_stream, args.tgt_len, sample_mem_len, args.sample_len, args.seed)
        text_sample = decode(new_ids, vocab)
        print(f"\nsample (top-k {TOP_K}, temperature {TEMPERATURE}), continuing the end of the validation text:")
        print("---- end of the validation text " + "-" * 40)
        print(decode(valid_stream[-120:], vocab).rstrip("\n"))
        print("---- generated " + "-" * 57)
        print(text_sample.rstrip("\n"))
        print("-" * 72)

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        save_model_atomically(model, args.out)
        write_json_atomically(args.out / "vocab.json", vocab)
        metrics.update(
            valid_bpc={key: result["all"] for key, result in results.items()},
            valid_bpc_segment_start={key: result["segment_start"] for key, result in results.items()},
            memory_lengths={key: mem_len for key, _, mem_len in modes},
            sample=text_sample,
            args={key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        )
        write_json_atomically(args.out / "metrics.json", metrics)  # written last: its presence means a whole run
        print(f"\nsaved the model, vocab.json and metrics.json to {args.out}")
    print(f"\ndone in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
