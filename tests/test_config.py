"""Every field of every Config is checked against its annotation, in one place: a wrong value is one
EdgebertError that names the field, what was given and what is expected."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing

import pytest

import edgebert
from edgebert.config import Config
from edgebert.data import DataConfig
from edgebert.errors import EdgebertError
from edgebert.passes.distill import DistillConfig
from edgebert.passes.share import ShareConfig
from edgebert.quantize.config import MixedPrecisionConfig, QATConfig, StaticInt8Config

for module in pkgutil.walk_packages(edgebert.__path__, "edgebert."):  # every Config subclass is defined
    importlib.import_module(module.name)

from edgebert.export.onnx_text import OnnxTextConfig  # noqa: E402

VALID = {DataConfig: {"train": "train.csv"}, OnnxTextConfig: {"tokenizer": "bundle"}}  # the configs with a required field


def _subclasses(cls: type) -> list[type]:
    return [c for s in cls.__subclasses__() for c in (s, *_subclasses(s)) if c.__module__.startswith("edgebert.")]


FIELDS = [(cls, f.name) for cls in _subclasses(Config) for f in dataclasses.fields(cls)]


def _wrong(cls: type, name: str):
    """A value of the wrong type: a number where a string fits, else a string."""
    hint = typing.get_type_hints(cls)[name]
    takes_text = hint is str or str in typing.get_args(hint)
    return 1.5 if takes_text else "bogus"


def test_every_config_is_covered():
    names = {cls.__name__ for cls, _ in FIELDS}
    assert {"TrainConfig", "PruneConfig", "DataConfig", "MixedPrecisionConfig", "QuantizeStageConfig",
            "OnnxExportConfig", "TFLiteExportConfig", "SearchConfig"} <= names


@pytest.mark.parametrize("cls, name", FIELDS, ids=[f"{c.__name__}.{n}" for c, n in FIELDS])
def test_a_wrong_type_names_the_field(cls, name):
    value = _wrong(cls, name)
    with pytest.raises(EdgebertError) as e:
        cls(**{**VALID.get(cls, {}), name: value})
    message = str(e.value)
    assert message.startswith(f"{cls.table or cls.__name__}.{name}: ")
    assert repr(value) in message and "\n" not in message


@pytest.mark.parametrize("build, message", [
    (lambda: MixedPrecisionConfig(io="bogus"), "MixedPrecisionConfig.io: unknown io 'bogus'; use one of float, int8"),
    (lambda: MixedPrecisionConfig(samples="many"), "MixedPrecisionConfig.samples: expected an int, got 'many'"),
    (lambda: MixedPrecisionConfig(samples=0), "MixedPrecisionConfig.samples counts examples: give at least 1"),
    (lambda: StaticInt8Config(target="gpu"), "StaticInt8Config.target: unknown target 'gpu'; use one of x86, "),
    (lambda: StaticInt8Config(exclude=("layernorm", "conv")), "StaticInt8Config.exclude: expected a tuple of values "
                                                                "from 'linear',"),
    (lambda: QATConfig(seq_lens=[16, 32]), "QATConfig.seq_lens: expected a tuple of int, got [16, 32]"),
    (lambda: QATConfig(train={"steps": 3}), "QATConfig.train: expected a TrainConfig, got {'steps': 3}"),
    (lambda: DistillConfig(layer_map={"1": 2}), "DistillConfig.layer_map: expected a dict of int to int or None"),
    (lambda: DistillConfig(temperature=True), "DistillConfig.temperature: expected a number, got True"),
    (lambda: ShareConfig(init="first"), "ShareConfig.init: expected one of 'mean', 'best' or an int, got 'first'"),
    (lambda: ShareConfig(init=-1), "ShareConfig.init must be 'mean', 'best' or a member index, got -1"),
    (lambda: DataConfig(train="t.csv", kind="ner"), "data.kind: unknown kind 'ner'; use one of classification, "),
])
def test_values_are_checked_inside_and_after_types(build, message):
    with pytest.raises(EdgebertError) as e:
        build()
    assert str(e.value).startswith(message)


def test_right_values_pass_and_replace_checks_again():
    config = ShareConfig(init=1, parts="none", recovery=None)
    assert config.replace(init="best").init == "best" and StaticInt8Config(samples=2**40).samples == 2**40
    assert DistillConfig(temperature=3, layer_map={1: 2}).temperature == 3  # an int is a number
    with pytest.raises(EdgebertError, match="ShareConfig.parts: unknown parts 'some'"):
        config.replace(parts="some")
