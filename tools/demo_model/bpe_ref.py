"""A plain-Python encoder for the tiny byte-level BPE tokenizer.json (tests/golden/tiny-chat).

Only for checks on machines without the `tokenizers` library (token counts of the corpus here);
training uses `tokenizers`. Needs the `regex` module for \\p{L} / \\p{N}. Covers exactly what that
file uses: added tokens split out first (longest match), one Split(regex, Isolated) pre-tokenizer,
ByteLevel(add_prefix_space=false, use_regex=false), BPE with merge ranks, no normalizer, no
post-processor. `python3 tools/demo_model/bpe_ref.py` checks it against the 426 reference
encodings of tests/golden/tokenizer/reference.json (made by `tokenizers`).
"""
import json
import os
import sys


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (what ByteLevel maps bytes to)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class ByteLevelBpe:
    def __init__(self, path):
        import regex
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        model = tj["model"]
        if model["type"] != "BPE" or tj.get("normalizer") or tj.get("post_processor"):
            raise ValueError(f"{path}: not the plain byte-level BPE this encoder covers")
        pre = tj["pre_tokenizer"]["pretokenizers"]
        if [p["type"] for p in pre] != ["Split", "ByteLevel"] or pre[0]["behavior"] != "Isolated":
            raise ValueError(f"{path}: unexpected pre_tokenizer {tj['pre_tokenizer']}")
        self.split = regex.compile(pre[0]["pattern"]["Regex"])
        self.vocab = model["vocab"]
        self.ranks = {}
        for i, m in enumerate(model["merges"]):
            a, b = m if isinstance(m, list) else m.split(" ", 1)
            self.ranks[(a, b)] = i
        self.added = {t["content"]: t["id"] for t in tj["added_tokens"]}
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        self.id_to_token.update({i: t for t, i in self.added.items()})
        self.byte_map = bytes_to_unicode()
        self.byte_unmap = {c: b for b, c in self.byte_map.items()}
        self.cache = {}

    def vocab_size(self):
        return len(self.id_to_token)

    def token_id(self, text):
        return self.added.get(text, self.vocab.get(text))

    def _bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            best, best_i = None, -1
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, best_i = r, i
            if best is None:
                break
            a, b = parts[best_i], parts[best_i + 1]
            merged, i = [], 0
            while i < len(parts):  # merge every occurrence of the pair, left to right
                if i < len(parts) - 1 and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = [self.vocab[p] for p in parts]
        self.cache[word] = ids
        return ids

    def _segments(self, text):
        """Splits out added tokens (longest match first): [(is_added, text)]."""
        out, start, i = [], 0, 0
        specials = sorted(self.added, key=len, reverse=True)
        while i < len(text):
            hit = next((s for s in specials if text.startswith(s, i)), None)
            if hit is None:
                i += 1
                continue
            if i > start:
                out.append((False, text[start:i]))
            out.append((True, hit))
            i += len(hit)
            start = i
        if start < len(text):
            out.append((False, text[start:]))
        return out

    def encode(self, text):
        ids = []
        for is_added, seg in self._segments(text):
            if is_added:
                ids.append(self.added[seg])
                continue
            pos = 0
            pieces = []
            for m in self.split.finditer(seg):
                if m.start() > pos:
                    pieces.append(seg[pos:m.start()])
                pieces.append(m.group(0))
                pos = m.end()
            if pos < len(seg):
                pieces.append(seg[pos:])
            for p in pieces:
                if p:
                    ids.extend(self._bpe("".join(self.byte_map[b] for b in p.encode("utf-8"))))
        return ids

    def decode(self, ids):
        out, buf = [], bytearray()
        for i in ids:
            t = self.id_to_token[i]
            if t in self.added:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                out.append(t)
            else:
                buf.extend(self.byte_unmap[c] for c in t)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    ref_path = os.path.join(root, "tests", "golden", "tokenizer", "reference.json")
    tok = ByteLevelBpe(os.path.join(root, "tests", "golden", "tiny-chat", "tokenizer.json"))
    with open(ref_path, encoding="utf-8") as f:
        ref = json.load(f)
    bad = [c for c in ref["cases"] if tok.encode(c["text"]) != c["ids"]]
    for c in bad[:5]:
        print("MISMATCH", repr(c["text"][:80]), tok.encode(c["text"])[:20], c["ids"][:20])
    print(f"bpe_ref: {len(ref['cases']) - len(bad)}/{len(ref['cases'])} reference encodings equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
