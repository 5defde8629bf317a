#!/usr/bin/env python3
"""Writes tests/golden/tokenizer/corpus.txt: the training/reference corpus of the tiny tokenizer.

Deterministic, standard library only, runs anywhere (no torch). English prose is taken from the
Debian license texts in /usr/share/common-licenses (present on Debian machines); the rest is
written here: source code, Chinese, Japanese, Korean, emoji, combining accents, numbers, runs of
spaces/tabs, and the GLM special tokens inline.

Usage: python3 tools/golden/make_corpus.py [OUT_PATH]
"""
import os
import random
import sys

LICENSES = ["GPL-3", "Apache-2.0", "BSD", "Artistic", "MPL-2.0", "CC0-1.0"]

CODE = r'''#include <cstdint>
#include "engine/model/glm_moe_dsa.h"
namespace glm {
absl::StatusOr<Tensor> Embed(const Tensor& table, absl::Span<const int32_t> ids) {
  if (ids.empty()) return absl::InvalidArgumentError("Embed: no token ids; pass at least one");
  for (size_t i = 0; i < ids.size(); ++i) {
    out.row(i) = table.row(ids[i]);  // [T, H]
  }
}
}  // namespace glm
def rms_norm(x, w, eps=1e-5):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
	if (x->next != NULL && x->next->value >= 0x7fffffff) { return -1; }
		return fmt.Errorf("shard %d of %d: %w", i, n, err)
for (int i = 0; i < n; i += 128) { acc += a[i] * b[i]; }
SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;
x = [i ** 2 for i in range(10) if i % 3 != 0]
const std::vector<float> logits(vocab_size, -std::numeric_limits<float>::infinity());
  "weight_block_size": [128, 128], "quant_method": "fp8", "fmt": "e4m3"
echo "$HOME/.cache" | sed -e 's/\/root/~/g' && ls -la /tmp/*.json 2>/dev/null
let mut v: Vec<u8> = Vec::with_capacity(4096); v.extend_from_slice(&buf[..n]);
<div class="msg"><span id="a1">Hello&nbsp;world</span></div>
{"prompt_ids": [1, 2, 3], "greedy_ids": [], "logits_shape": [12, 256]}
    return a if a > b else b  # max
while (i--) { *p++ = *q++; }
fn main() { println!("{:>8.3}", 3.14159_f32); }
0x1F600 0b1010 0o777 1e-6 6.02214076e23 -0.0 +inf NaN
'''

CHINESE = [
    "今天天气很好，我们一起去公园散步吧。",
    "模型的输出必须与参考实现完全一致。",
    "请把这段文字翻译成英文，并保留原来的格式。",
    "稀疏注意力只保留得分最高的若干个位置。",
    "混合专家模型在每一层为每个词元选择两个专家。",
    "他说：“明天早上八点在图书馆门口见。”",
    "这个问题的答案是四十二，但问题本身是什么？",
    "北京、上海、广州和深圳都是大城市。",
    "数字一二三四五六七八九十，还有百千万亿。",
    "学习编程需要耐心，也需要大量的练习。",
    "请输入您的用户名和密码（区分大小写）。",
    "我们在第3层使用共享的索引器，以节省计算量。",
    "中文没有空格，分词器需要自己学会切分。",
    "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
    "温度设为零时，采样退化为贪心解码。",
    "服务器返回了错误代码500，请稍后再试。",
    "长上下文推理对显存的要求非常高。",
    "你好！有什么可以帮你的吗？",
]

JAPANESE = [
    "今日はとても良い天気ですね。",
    "東京駅から新幹線で大阪まで行きます。",
    "このプログラムはテストに合格しました。",
    "すみません、もう一度ゆっくり話していただけますか？",
    "カタカナとひらがなと漢字が混ざっています。",
    "ｶﾀｶﾅの半角文字も時々使われます。",
    "猫が窓の外をじっと見ている。",
    "明日の会議は午後三時からです。",
    "トークナイザーの学習データを準備する。",
    "ありがとうございます。よろしくお願いします。",
]

KOREAN_ETC = [
    "안녕하세요, 만나서 반갑습니다.",
    "한국어 문장도 조금 넣어 봅니다.",
    "Привет, мир! Как дела?",
    "Ελληνικά: καλημέρα κόσμε",
    "العربية: مرحبا بالعالم",
    "עברית: שלום עולם",
    "हिन्दी: नमस्ते दुनिया",
    "ไทย: สวัสดีชาวโลก",
    "Tiếng Việt: Xin chào thế giới, tôi là một mô hình.",
    "Deutsch: Größenordnung, Straße, Äpfel und Öl.",
    "Français : « Où est la bibliothèque ? » demanda-t-il.",
    "Español: ¿Dónde está el baño? ¡Muchas gracias!",
    "Português: ação, coração, pão e limão.",
    "Polski: zażółć gęślą jaźń.",
    "Türkçe: İstanbul'da ılık bir gün.",
]

EMOJI = [
    "I love this 😀😃😄 so much!",
    "Family: 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵🇨🇳",
    "Thumbs 👍🏽👍🏿 skin tones",
    "Weather: ☀️🌧️⛈️❄️",
    "Hearts ❤️💛💚💙💜🖤",
    "🚀 Launch at T-minus 10… 9… 8…",
    "Math symbols: ∑ ∫ √ ∞ ≤ ≥ ≠ ± × ÷ π",
    "Arrows → ← ↑ ↓ ⇒ ⇔ and box drawing ┌─┐│└─┘",
    "Currency: $100, €99.99, £5, ¥1000, ₹250, ₿0.001",
]

ACCENTS = [
    "café naïve résumé coöperate",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",  # decomposed (combining) forms
    "e\u0301\u0302\u0303 stacked combining marks",
    "Zalgo: Z\u0351\u0352a\u0353l\u0354g\u0355o\u0356",
    "\u0301 a lone combining mark at the start",
    "Ångström vs A\u030angstro\u0308m",
    "ﬁ ligature and ① circled and ＡＢＣ fullwidth",
    "zero\u200bwidth\u200bspace and non\u00a0breaking\u00a0space",
]

NUMBERS = [
    "1 12 123 1234 12345 123456 1234567 12345678901234567890",
    "3.14159265358979 2.71828 -42 +7 1,000,000 1_000_000",
    "2026-11-29T06:56:14Z and 08:30 UTC",
    "Version 5.17.0, build 20261129, port 8080, IP 127.0.0.1",
    "Phone: +1 (555) 010-9999; ZIP 94103-1234",
    "The answer is 42. The year was 1999. 100% sure.",
    "000123 007 0.0001 1e10 1E-10 0xDEADBEEF",
    "第1章 第23节 共456页 ２０２６年",
]

WHITESPACE = [
    "two  spaces   three    four     five",
    "\ttab\tseparated\tvalues\t",
    "trailing spaces   ",
    "    four leading spaces",
    "mixed \t \t whitespace\t\t\tand  tabs",
    "                                        forty spaces",
    " a b c d e f g ",
]

SPECIAL = [
    "[gMASK]<sop><|system|>\nYou are a helpful assistant.<|user|>\nHello!<|assistant|>\nHi there.",
    "<|user|>What is 2+2?<|assistant|>4<|endoftext|>",
    "[MASK] is a mask, [sMASK] too, and <eop> ends a part.",
    "<|observation|>{\"temperature\": 21}<|assistant|>It is 21 degrees.",
    "text<|endoftext|>more text<|endoftext|><|endoftext|>",
    "not special: <|user| and |user|> and <sop and [gMASK",
    "<|system|><|user|><|assistant|><|observation|>",
]

# Short English phrases with contractions (the (?i:'s|'t|...) branch of the regex).
CONTRACTIONS = [
    "It's fine, isn't it? We're done, they've left, I'm here, we'll see, he'd know.",
    "IT'S LOUD. DON'T SHOUT. YOU'RE RIGHT. I'VE GOT IT. I'M OK. WE'LL GO. SHE'D SAY.",
    "rock'n'roll, o'clock, 'quoted', ''double'', l'homme",
]


def license_lines(root="/usr/share/common-licenses"):
    out = []
    for name in LICENSES:
        path = os.path.join(root, name)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if line.strip():
                    out.append(line)
    return out


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/tokenizer/corpus.txt"
    rng = random.Random(20261129)
    prose = license_lines()
    # A deterministic sample keeping order: about 260 lines of varied English.
    if len(prose) > 260:
        idx = sorted(rng.sample(range(len(prose)), 260))
        prose = [prose[i] for i in idx]
    lines = []
    lines += prose
    lines += [l for l in CODE.split("\n") if l != ""]
    lines += CHINESE + JAPANESE + KOREAN_ETC + EMOJI + ACCENTS + NUMBERS + WHITESPACE + CONTRACTIONS
    # Special-token lines may hold '\n'; the corpus is one line per entry, so escape newlines as
    # real line breaks are not allowed inside an entry: keep them on one line each.
    lines += [s.replace("\n", " ") for s in SPECIAL]
    # Interleave the non-English material through the prose so every chunk is mixed.
    head, tail = lines[: len(prose)], lines[len(prose):]
    mixed = []
    step = max(1, len(head) // max(1, len(tail)))
    ti = 0
    for i, l in enumerate(head):
        mixed.append(l)
        if i % step == step - 1 and ti < len(tail):
            mixed.append(tail[ti])
            ti += 1
    mixed += tail[ti:]
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8", newline="\n") as f:
        for l in mixed:
            assert "\n" not in l and "\r" not in l
            f.write(l + "\n")
    print(f"wrote {len(mixed)} lines to {out_path}")


if __name__ == "__main__":
    main()
