"""Held-out splits that do not leak: `carve` moves whole groups of related examples.

A plain random sample of SST-2's training phrases is mostly phrases of training sentences (908 of 1,000
were a run of words inside a kept phrase), so choosing checkpoints on it is choosing on training data.
`carve` keeps three rules, by what the examples are:
- single texts: no carved text is a run of whole words inside a kept text, or holds one (texts compared
  lower-cased, whitespace collapsed); it carves whole sentences with the phrases only they hold, and the
  phrases a carved sentence shares with kept ones go to neither side;
- pairs: no sentence is on both sides (pairs joined by a shared sentence move together);
- token tasks: whole documents (`Split.documents`), else whole sentences.
"""

from __future__ import annotations

import random
from collections import defaultdict

from ..errors import EdgebertError
from .tasks import Split


def carve(split: Split, size: int, seed: int, *, name: str) -> tuple[Split, Split]:
    """(the rest, about `size` seeded examples named `name`) of `split`, each in file order. Whole groups
    move, so the carved split may pass `size` by one group; examples that would tie the two sides (a
    phrase inside a carved sentence that kept sentences also hold) are in neither:
    len(split) - len(rest) - len(carved) of them."""
    first = split.examples[0] if split.examples else None
    if first is not None and isinstance(first.text, list):
        groups = split.documents or list(range(len(split)))
        carved, dropped = _whole(groups, size, seed), set()
    elif first is not None and first.text_pair is not None:
        groups = _linked([(_key(e.text), _key(e.text_pair)) for e in split.examples])
        carved, dropped = _whole(groups, size, seed), set()
    else:
        carved, dropped = _Phrases([_key(e.text) for e in split.examples]).carve(size, seed)
    kept = [i for i in range(len(split)) if i not in carved and i not in dropped]
    if not kept:
        raise EdgebertError(f"{split.task.name}: carving {size} {name} examples out of {len(split)} leaves none to "
                            "train on (its examples share sentences or documents with each other): give a smaller "
                            f"{name} size or a {name} file of its own")
    return split.subset(kept), split.subset(sorted(carved), name=name)


def _key(text: str) -> str:
    return " ".join(text.lower().split())


def _whole(groups: list, size: int, seed: int) -> set[int]:
    """Example indices of seeded-random whole groups (group id per example) until there are `size`."""
    members = defaultdict(list)
    for i, group in enumerate(groups):
        members[group].append(i)
    order = list(members)
    random.Random(seed).shuffle(order)
    carved: set[int] = set()
    for group in order:
        if len(carved) >= size:
            break
        carved.update(members[group])
    return carved


def _linked(pairs: list[tuple[str, str]]) -> list[int]:
    """A group id per pair: pairs that share a sentence, directly or through others, share one."""
    parent: dict[str, str] = {}

    def root(s: str) -> str:
        parent.setdefault(s, s)
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    for a, b in pairs:
        parent[root(a)] = root(b)
    ids: dict[str, int] = {}
    return [ids.setdefault(root(a), len(ids)) for a, _ in pairs]


class _Phrases:
    """Single texts, with which of them sit inside which as runs of whole words."""

    def __init__(self, keys: list[str]):
        self.rows: dict[str, list[int]] = defaultdict(list)  # text -> its example indices (duplicates move together)
        for i, key in enumerate(keys):
            self.rows[key].append(i)
        self.holding: dict[str, set[str]] = defaultdict(set)  # word -> texts that hold it
        for key in self.rows:
            for word in key.split():
                self.holding[word].add(key)

    def containers(self, key: str):
        """The other texts that hold `key` as a run of words, from the texts holding its rarest word."""
        words = key.split()
        if not words:
            return
        padded = f" {key} "
        for other in self.holding[min(words, key=lambda w: len(self.holding[w]))]:
            if other != key and padded in f" {other} ":
                yield other

    def inside(self, key: str) -> list[str]:
        """`key` and the texts that are runs of its words, longest first."""
        w = key.split()
        spans = {" ".join(w[i:j]) for i in range(len(w)) for j in range(i + 1, len(w) + 1)}
        return sorted((s for s in spans if s in self.rows), key=lambda s: (-len(s.split()), s)) or [key]

    def carve(self, size: int, seed: int) -> tuple[set[int], set[int]]:
        """(carved, dropped) example indices: seeded-random texts no other text holds, each with the texts
        inside it that only carved texts hold; the others inside it (held by kept texts too) are dropped."""
        order = list(self.rows)
        random.Random(seed).shuffle(order)
        held: set[str] = set()
        dropped: set[str] = set()
        count = 0
        for top in order:
            if count >= size:
                break
            if top in held or top in dropped or next(self.containers(top), None) is not None:
                continue
            for key in self.inside(top):  # longest first: a text's containers are decided before it
                if key in held or key in dropped:
                    continue
                if all(other in held for other in self.containers(key)):
                    held.add(key)
                    count += len(self.rows[key])
                else:
                    dropped.add(key)
        return ({i for key in held for i in self.rows[key]}, {i for key in dropped for i in self.rows[key]})
