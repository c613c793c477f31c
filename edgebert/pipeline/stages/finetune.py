"""finetune: train the start model on the task (skipped when the recipe starts from a teacher)."""

from edgebert import data
from edgebert.errors import EdgebertError
from edgebert.passes import FinetuneConfig, finetune

from ..context import pass_stage
from ..resources import Training, Work, evaluated, examples
from .registry import Stage, register


def check(recipe, options, encoder, tokenizer) -> None:
    if recipe.data is None and data.get_task(recipe.task).kind == "embedding" and not recipe.teacher:
        raise EdgebertError(f"stages: the {recipe.task} task trains on unlabeled text, so it has no finetune stage; "
                            "start from a sentence-embedding model (model = \"minilm\") and list distill, prune, "
                            "quantize and export")


def work(options: FinetuneConfig, data) -> Work:
    return Work(train=examples(options.train), infer=evaluated(options.train, data), config=options.train)


register(Stage(name="finetune", options=FinetuneConfig, run=pass_stage(finetune), by_default=True, check=check,
               trains=lambda o: Training(o.train.batch_size, "train.batch_size"), work=work, makes_model=True,
               fine_tunes=True))
