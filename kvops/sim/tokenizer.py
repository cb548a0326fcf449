"""A deterministic word-level tokenizer, so text prompts have exact, predictable token counts.

One whitespace-separated word is one token. Every token id below the vocabulary size has a
pronounceable six-letter spelling (three consonant-vowel syllables, base 100), and that spelling
tokenizes back to the same id; any other word maps to a stable hash (blake2b) of itself. So
`detokenize(tokenize(text))` keeps the word count, and text built from `detokenize(ids)` round
trips exactly, which lets clients calibrate text prompts through `/tokenize`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

_CONSONANTS = "bcdfghjklmnprstvwxyz"  # 20
_VOWELS = "aeiou"  # 5
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 100
_SYLLABLE_INDEX = {s: i for i, s in enumerate(_SYLLABLES)}
_WORD_SYLLABLES = 3  # 100**3 = 1,000,000 ids, more than any supported vocabulary


class WordTokenizer:
    def __init__(self, vocab_size: int) -> None:
        if not 0 < vocab_size <= len(_SYLLABLES) ** _WORD_SYLLABLES:
            raise ValueError(f"vocab_size must be in 1..1000000, got {vocab_size}")
        self.vocab_size = vocab_size

    def id_to_word(self, token_id: int) -> str:
        parts = []
        value = token_id
        for _ in range(_WORD_SYLLABLES):
            value, digit = divmod(value, len(_SYLLABLES))
            parts.append(_SYLLABLES[digit])
        return "".join(reversed(parts))

    def word_to_id(self, word: str) -> int:
        if len(word) == 2 * _WORD_SYLLABLES:
            value = 0
            for k in range(_WORD_SYLLABLES):
                digit = _SYLLABLE_INDEX.get(word[2 * k : 2 * k + 2])
                if digit is None:
                    break
                value = value * len(_SYLLABLES) + digit
            else:
                if value < self.vocab_size:
                    return value
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.vocab_size

    def encode(self, text: str) -> list[int]:
        return [self.word_to_id(word) for word in text.split()]

    def decode(self, token_ids: Sequence[int]) -> str:
        return " ".join(self.id_to_word(t) for t in token_ids)

    def decode_piece(self, token_id: int) -> str:
        """Text of one generated token as a stream chunk: a space then the word."""
        return " " + self.id_to_word(token_id)
