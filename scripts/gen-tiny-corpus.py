#!/usr/bin/env python3
"""Writes configs/data/tiny_corpus.txt: the small corpus of the built-in demo.

The text is generated from a small grammar of the project's own, with a fixed seed, so it is
reproducible and owes nothing to any other text. It has enough structure (recurring words,
agreement, punctuation, line shape) that a tiny byte-level model's loss falls visibly within a
few hundred steps. One document per line.
"""
import random
import sys

SUBJECTS = ["the gardener", "a young engineer", "the old sailor", "my neighbour", "the baker",
            "a quiet student", "the river pilot", "our teacher", "the night guard", "a travelling poet",
            "the clockmaker", "the weaver", "a tired doctor", "the ferryman", "the shepherd"]
VERBS = ["found", "carried", "painted", "repaired", "counted", "watched", "wrote about",
         "remembered", "cleaned", "measured", "followed", "built", "sold", "borrowed", "lost"]
OBJECTS = ["a small blue boat", "the broken lantern", "seven wooden chairs", "an empty jar",
           "the long letter", "a basket of apples", "the silver key", "two grey stones",
           "the map of the valley", "a bundle of rope", "the tall ladder", "an old violin",
           "the garden gate", "a loaf of bread", "the winter coat"]
PLACES = ["near the harbour", "by the mill", "under the bridge", "in the market", "behind the church",
          "at the edge of town", "on the hill", "beside the well", "in the library", "along the canal"]
TIMES = ["in the morning", "before dawn", "after the rain", "on sunday", "at noon", "late at night",
         "during the storm", "in early spring", "when the bells rang", "as the sun went down"]
CLOSINGS = ["and nobody said a word.", "and then went home.", "and smiled at the sky.",
            "because it had to be done.", "while the dog slept.", "and the town was quiet again.",
            "so the children laughed.", "and wrote it all down.", "before anyone noticed.",
            "and that was the end of it."]


def sentence(rng):
    s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.6:
        s += f" {rng.choice(PLACES)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(TIMES)}"
    s += f" {rng.choice(CLOSINGS)}"
    return s[0].upper() + s[1:]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "configs/data/tiny_corpus.txt"
    rng = random.Random(1234)
    with open(out, "w", encoding="utf-8") as f:
        for _ in range(2000):
            f.write(" ".join(sentence(rng) for _ in range(rng.randint(1, 3))) + "\n")


if __name__ == "__main__":
    main()
