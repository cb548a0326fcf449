"""`decode_body`: the server's fast path for token-id prompts gives what `json.loads` gives."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvops.sim.openai_api import decode_body, parse_request
from kvops.sim.tokenizer import WordTokenizer


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt":[1,2, 3],"max_tokens":2}',
        b'{"model":"m","prompt":[ 7 ],"stream":true}',
        b'{"prompt":[]}',
        b'{"prompt":[ ]}',
        b'{"x":{"prompt":[1]},"prompt":"hi"}',
        b'{"prompt":[99999999999999999999999]}',
        b'{"prompt":[9223372036854775808]}',
        b'{"prompt":[-1]}',
        b'{"prompt":[[1,2]]}',
        b'{"prompt":[1.5]}',
        b'{"prompt": [1,2]}',
        b'{"messages":[{"role":"user","content":"\\"prompt\\":[1]"}]}',
    ],
)
def test_same_as_json_loads(raw: bytes) -> None:
    got = decode_body(raw)
    want = json.loads(raw)
    if isinstance(got.get("prompt"), np.ndarray):
        assert got["prompt"].dtype == np.int64
        got = {**got, "prompt": got["prompt"].tolist()}
    assert got == want


@pytest.mark.parametrize("raw", [b'{"prompt":[1,,2]}', b'{"prompt":[1,2,]}', b'{"prompt":[1 2]}'])
def test_invalid_json_still_fails(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        decode_body(raw)


def test_array_prompt_parses_like_a_list() -> None:
    tok = WordTokenizer(1000)
    ids = list(range(5, 905))
    raw = json.dumps({"prompt": ids, "max_tokens": 3}).encode()
    fast = parse_request(decode_body(raw), False, tok, "m", 4096)
    slow = parse_request(json.loads(raw), False, tok, "m", 4096)
    assert list(fast.prompt_ids) == list(slow.prompt_ids) == ids
    assert fast.max_tokens == slow.max_tokens == 3
    bad = json.dumps({"prompt": [1, 2000]}).encode()
    with pytest.raises(Exception, match="Token id 2000 is out of vocabulary"):
        parse_request(decode_body(bad), False, tok, "m", 4096)
