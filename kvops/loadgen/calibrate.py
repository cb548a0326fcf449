"""Learning from the server what a valid, exact-length prompt looks like (the client's side).

It lives with the client, not with `kvops.workload`: it talks HTTP to the server, and the
workload package produces plain planned requests only (no import back into `kvops.loadgen`).

Why: token ids at or above the model's vocabulary size are answered with HTTP 400, and a text
prompt's token count depends on the server's tokenizer. So, before a run, kvops asks the server
(`/tokenize`) which ids a sample text maps to and uses only those; when the server refuses
token-id prompts it switches to text made of words that each tokenize to exactly one token
(byte-level BPE pre-tokenizers split on spaces, so counts add up word by word), with the
tokenizer's special tokens (BOS) accounted for.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from kvops.errors import KvopsError
from kvops.loadgen.client import CompletionRequest, Endpoint, read_text, send_request
from kvops.workload.generate import Alphabet

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her it an are be this which "
    "or had not but were they have one all their there been has when who will more no if out "
    "so said what up its about into than them can only other new some could time these two "
    "may then do first any my now such like our over man me even most made after also did "
    "many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long "
    "get here between both life being under never day same another know while last might us "
    "great old year off come since against go came right used take three"
)
_WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class AlphabetError(KvopsError, RuntimeError):
    """The server gave no way to build valid prompts; the message says what to pass instead."""


async def _tokenize(
    session: aiohttp.ClientSession, base_url: str, model: str, text: str, special: bool
) -> list[int] | None:
    """Token ids for `text` via vLLM's `/tokenize` (llama.cpp's body shape as a fallback)."""
    url = base_url.rstrip("/") + "/tokenize"
    bodies: list[dict[str, Any]] = [
        {"model": model, "prompt": text, "add_special_tokens": special},
        {"content": text, "add_special": special},
    ]
    for body in bodies:
        try:
            async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as r:
                if r.status != 200:
                    continue
                data = json.loads(await read_text(r))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            return tokens
    return None


async def _accepts_token_ids(
    session: aiohttp.ClientSession, endpoint: Endpoint, ids: list[int]
) -> tuple[bool, str]:
    probe = CompletionRequest(request_id="kvops-probe", prompt=ids, output_tokens=1)
    rec = await send_request(session, endpoint, probe, timeout_s=120.0, stall_timeout_s=60.0)
    if rec.http_status is not None and 400 <= rec.http_status < 500:
        return False, rec.error or f"HTTP {rec.http_status}"
    return True, rec.error or ""


async def learn_alphabet(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    *,
    vocab_size: int | None = None,
    text_prompts: bool = False,
) -> tuple[Alphabet, str]:
    """The alphabet to build prompts from, and a sentence saying how it was chosen."""
    base, model = endpoint.base_url, endpoint.model
    if not text_prompts:
        if vocab_size is not None:
            alphabet = Alphabet.from_vocab_size(vocab_size)
            how = f"token-id prompts, ids below --vocab-size {vocab_size}"
        else:
            ids = await _tokenize(session, base, model, " ".join(_WORDS) + " 0123456789", False)
            if not ids:
                raise AlphabetError(
                    f"{base}: no /tokenize to learn valid token ids from; pass --vocab-size N "
                    "(the model's vocabulary size) or --text-prompts"
                )
            alphabet = Alphabet(ids=tuple(sorted(set(ids))))
            how = f"token-id prompts from {len(alphabet.ids)} ids learned through /tokenize"
        probe_ids = [alphabet.id_at(i) for i in range(min(8, alphabet.size))]
        ok, why = await _accepts_token_ids(session, endpoint, probe_ids)
        if ok:
            return alphabet, how
        how_fallback = f"server refused token-id prompts ({why[:80]}); "
    else:
        how_fallback = ""
    return await _text_alphabet(session, base, model), how_fallback + "text prompts calibrated"


async def _text_alphabet(session: aiohttp.ClientSession, base: str, model: str) -> Alphabet:
    words: list[str] = []
    for word in _WORDS:
        ids = await _tokenize(session, base, model, " " + word, False)
        if ids is None:
            raise AlphabetError(f"{base}: text prompts need the server's /tokenize to be exact")
        if len(ids) == 1:
            words.append(word)
    if len(words) < 8:
        raise AlphabetError(f"{base}: too few one-token words in this tokenizer for exact prompts")
    plain = await _tokenize(session, base, model, " " + words[0], False) or []
    with_special = await _tokenize(session, base, model, " " + words[0], True) or []
    return Alphabet(words=tuple(words), special_tokens=max(0, len(with_special) - len(plain)))


async def count_tokens(
    session: aiohttp.ClientSession, base: str, model: str, text: str
) -> int | None:
    """The server's token count for a prompt (specials included), for spot checks."""
    ids = await _tokenize(session, base, model, text, True)
    return len(ids) if ids is not None else None
