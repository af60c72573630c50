"""Replies of a misbehaving OpenAI-compatible server, shared by the fault tests and the hardening probe.

Only the replies that are plain JSON live here; each user adds the transport
faults (cut connections, trickles) its own handler sends.
"""

GOOD = {"choices": [{"message": {"role": "assistant", "content": "Blue."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2}}


def reply(msg=None, usage=GOOD["usage"], **choice) -> dict:
    return {"choices": [{"message": msg if msg is not None else GOOD["choices"][0]["message"],
                         "finish_reason": "stop", **choice}], "usage": usage}


def json_faults() -> dict:
    """{mode: reply}: well-formed JSON whose message or usage is not what the OpenAI format promises."""
    return {
        "good": GOOD,
        "parts": reply({"role": "assistant", "content": [{"type": "text", "text": "Bl"}, {"type": "text", "text": "ue."}]}),
        "int-content": reply({"role": "assistant", "content": 42}),
        "message-string": reply("hello"),
        "usage-list": reply(usage=[1, 2]),
        "no-content-key": reply({"role": "assistant"}),
        "huge-count": reply(usage={"prompt_tokens": 9, "completion_tokens": 10 ** 15}),
        "token-ids-mistyped": reply(token_ids=[5, "6", None]),
    }

