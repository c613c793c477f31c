"""vocab: drop the tokens the task's text never uses, from the embedding rows and the tokenizer together.

The stage's model folder holds the pruned tokenizer; compile re-encodes the data with it, so later
stages, the eval arrays and the bundle (tokenizer.json, vocab.txt, MediaPipe metadata) all use the new ids."""

from dataclasses import replace
from pathlib import Path

from edgebert import checkpoint, tokenizer as tokenization
from edgebert.errors import EdgebertError
from edgebert.passes import VocabConfig, prune_vocab
from edgebert.passes.vocab import check_prunable

from ..context import StageRecord, task_model
from ..resources import Work, eval_size
from .registry import Stage, register


def check(recipe, options: VocabConfig, encoder, tokenizer) -> None:
    if options.corpus is not None and not Path(options.corpus).is_file():
        raise EdgebertError(f"vocab.corpus: {options.corpus} is not a file; pass a UTF-8 text file, one text per line")
    check_prunable(tokenizer)


def run(ctx, state, options: VocabConfig, dest, work) -> StageRecord:
    result = prune_vocab(task_model(state.model, ctx.task), options, ctx.data, work_dir=work)
    checkpoint.save(result.model, dest / "model")
    tokenization.save(result.tokenizer, dest / "model")
    return replace(StageRecord.from_dict(result.record.to_dict()), new_tokenizer=True)


register(Stage(name="vocab", options=VocabConfig, run=run, keyed_by_code=True, check=check,
               work=lambda o, data: Work(seconds=5, infer=eval_size(data)), makes_model=True,
               searched={"min_count": "min_count"}))
