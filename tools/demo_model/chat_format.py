"""Chat rendering and the training pieces of a conversation, for the demo checkpoint.

Stdlib + Jinja2 only (no torch), so it runs on any machine: train_demo_model.py uses it on the
GPU machine, check_corpus.py here.

Rendering is transformers' `apply_chat_template` (5.x `_compile_jinja_template`):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension, `tojson` = json.dumps(ensure_ascii=False, indent=None, separators=None,
sort_keys=False), globals `raise_exception` and `strftime_now`; render(messages=..., tools=None,
documents=None, add_generation_prompt=..., **template kwargs). The gateway's Jinja interpreter is
byte-identical to this (README), so a prompt rendered here is the prompt the gateway sends.

A training sequence for the last assistant answer of a conversation is
    prompt_ids = encode(render(messages[:-1], add_generation_prompt=True, enable_thinking=E))
    target_ids = [encode("</think>") if E] + encode(ANSWER) + [<|user|>]
E false: the prompt already ends in `</think>`. E true: the prompt ends in `<think>` and the model
closes an empty reasoning block itself. The prompt and the target are encoded separately because
that is how serving sees them: the gateway encodes the rendered prompt alone and the model emits
the rest token by token, so any ids that decode to the target text are right. Encoding the pieces
apart keeps the answer's ids the same in both modes (encoding `</think>ANSWER` as one text would
merge `>` with the answer's first word into one pre-token). `<|user|>` (an eos id) is what the
template renders after an assistant turn, so generation stops there.
"""
import datetime
import json

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
EOS_AFTER_ANSWER = "<|user|>"


def load_template(path):
    """The chat template at `path` compiled as transformers compiles it."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    with open(path, encoding="utf-8") as f:
        return env.from_string(f.read())


def render(template, messages, add_generation_prompt, **kwargs):
    return template.render(messages=messages, tools=None, documents=None,
                           add_generation_prompt=add_generation_prompt, **kwargs)


def training_texts(template, messages, enable_thinking):
    """(prompt_text, target_text) for the last message of `messages`, an assistant turn."""
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("the last message must be the assistant answer to learn")
    prompt = render(template, messages[:-1], True, enable_thinking=enable_thinking)
    answer = messages[-1]["content"].strip()
    if enable_thinking:
        if not prompt.endswith(THINK_OPEN):
            raise ValueError(f"thinking-on prompt does not end in {THINK_OPEN}: {prompt[-40:]!r}")
        target = THINK_CLOSE + answer
    else:
        if not prompt.endswith(THINK_CLOSE):
            raise ValueError(f"thinking-off prompt does not end in {THINK_CLOSE}: {prompt[-40:]!r}")
        target = answer
        # The template renders a finished turn exactly as prompt + answer (history turns in later
        # requests look like what the model produced).
        full = render(template, messages, False)
        if full != prompt + answer:
            raise ValueError(f"template: rendered conversation != prompt + answer:\n{full!r}\n"
                             f"vs\n{prompt + answer!r}")
    return prompt, target


def read_jsonl(path):
    """List of {"messages": [...]} records; errors name the file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}") from None
            msgs = rec.get("messages") if isinstance(rec, dict) else None
            if (not isinstance(msgs, list) or len(msgs) != 2
                    or [m.get("role") for m in msgs] != ["user", "assistant"]
                    or not all(isinstance(m.get("content"), str) and m["content"].strip() for m in msgs)):
                raise ValueError(f"{path}:{n}: expected {{\"messages\": [{{\"role\": \"user\", "
                                 f"\"content\": ...}}, {{\"role\": \"assistant\", \"content\": ...}}]}}")
            rec["line"] = n
            out.append(rec)
    return out


SYSTEM_PROMPTS = [
    "You are a helpful assistant.", "Answer briefly.", "You are the glmctl assistant.",
    "Be concise and precise.",
]


class Encoder:
    """Token ids of a conversation's prompt and of its last answer.

    Fast path: the rendered prompt is `[gMASK]<sop>` + one piece per message + the generation
    prompt, each piece starting with a special token, and `tokenizers` splits special tokens out
    before BPE, so the ids are the concatenation of the pieces' ids (cached). verify()
    checks this against full rendering + encoding on many conversations and uses the slow path
    (render, then encode) when they ever differ.

    `tok` is a `tokenizers.Tokenizer` (or anything with encode(text).ids, decode(ids,
    skip_special_tokens) and token_to_id)."""

    def __init__(self, tok, template, eos_id):
        self.tok = tok
        self.template = template
        self.eos_id = eos_id
        self.cache = {}
        self.fast = True
        self.special = {t: tok.token_to_id(t) for t in ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>")}

    def _enc(self, text):
        ids = self.cache.get(text)
        if ids is None:
            ids = self.tok.encode(text).ids
            self.cache[text] = ids
        return ids

    def _fast(self, messages, thinking):
        s = self.special
        ids = [s["[gMASK]"], s["<sop>"]]
        for m in messages[:-1]:
            if m["role"] == "assistant":
                ids += [s["<|assistant|>"]] + self._enc(THINK_CLOSE + m["content"].strip())
            else:
                ids += [s["<|" + m["role"] + "|>"]] + self._enc(m["content"])
        ids += [s["<|assistant|>"]] + self._enc(THINK_OPEN if thinking else THINK_CLOSE)
        return ids, self.target_ids(messages[-1]["content"], thinking)

    def target_ids(self, answer, thinking):
        return (self._enc(THINK_CLOSE) if thinking else []) + self._enc(answer.strip()) + [self.eos_id]

    def slow(self, messages, thinking):
        """Render + encode the prompt; checks that the target ids decode to the target text."""
        prompt, target = training_texts(self.template, messages, thinking)
        ids = self.target_ids(messages[-1]["content"], thinking)
        if self.tok.decode(ids[:-1], skip_special_tokens=False) != target:
            raise ValueError(f"target ids do not decode to {target!r}")
        return self.tok.encode(prompt).ids, ids

    def __call__(self, messages, thinking):
        return self._fast(messages, thinking) if self.fast else self.slow(messages, thinking)

    def verify(self, conversations):
        for messages, thinking in conversations:
            if self._fast(messages, thinking) != self.slow(messages, thinking):
                print("WARNING: piecewise encoding differs from render+encode for",
                      json.dumps(messages)[:300], "thinking", thinking,
                      "-> rendering every sample in full (slower)", flush=True)
                self.fast = False
                return False
        return True


def sample_conversation(rng, examples, i, p_system, p_history):
    """Example i as the last turn, maybe after a system message and 1-2 other corpus turns."""
    msgs = []
    if rng.random() < p_system:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    if rng.random() < p_history:
        for _ in range(rng.choice((1, 2))):
            msgs += [dict(m) for m in examples[rng.randrange(len(examples))]["messages"]]
    msgs += [dict(m) for m in examples[i]["messages"]]
    return msgs, rng.random() < 0.5
