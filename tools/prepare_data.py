#!/usr/bin/python3
"""Turn text into token files that `stateflow train --data tokens` reads.

    tools/prepare_data.py build corpus.txt more.jsonl --out data/corpus --vocab-size 8000
    stateflow train --data tokens --data-path data/corpus.json --preset small --seq-len 256

`build` tokenizes the inputs with SentencePiece (Debian's python3-sentencepiece): it trains a
new tokenizer on them (--vocab-size), or uses an existing model (--tokenizer FILE.model, e.g.
a Llama-2 tokenizer). It writes
    PREFIX.tokens     the ids, little-endian uint16 (vocab <= 65536) or uint32
    PREFIX.docs       uint64 offset of each document's first token
    PREFIX.model      the tokenizer (when trained here)
    PREFIX.json       the manifest: files, token width, vocab size, documents, tokenizer
Inputs: a .jsonl file is one document per line (the --jsonl-key field, default "text"); any
other file is one document. Documents are packed one after another, each followed by the
tokenizer's end-of-text id (--separator eos, the default), or with nothing between them
(--separator none); PREFIX.docs keeps their boundaries either way.

`encode` and `decode` turn text into ids and back with a manifest's tokenizer, for
`stateflow generate --prompt-tokens FILE` and its output.
"""
import argparse
import json
import os
import struct
import sys
import tempfile

try:
    import sentencepiece as spm
except ImportError:
    sys.exit("error: this tool needs SentencePiece: apt-get install python3-sentencepiece "
             "(tools/install-deps.sh installs it) and run it with /usr/bin/python3")

FORMAT = "stateflow-tokens"


def read_documents(paths, jsonl_key):
    """Yields (source, text) for every document of the inputs, in order."""
    for path in paths:
        if not os.path.isfile(path):
            sys.exit(f"error: input {path} does not exist or is not a file")
        if path.endswith(".jsonl"):
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        sys.exit(f"error: {path} line {n} is not JSON ({e}); .jsonl inputs hold one JSON object a line")
                    if not isinstance(record, dict) or not isinstance(record.get(jsonl_key), str):
                        sys.exit(f"error: {path} line {n} has no string field '{jsonl_key}' (choose it with --jsonl-key)")
                    yield f"{path}:{n}", record[jsonl_key]
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                yield path, f.read()


def train_tokenizer(paths, jsonl_key, vocab_size, prefix):
    """Trains a SentencePiece BPE model on the inputs' documents; returns its file."""
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        for _, text in read_documents(paths, jsonl_key):
            for line in text.splitlines():
                if line.strip():
                    f.write(line + "\n")
        corpus = f.name
    try:
        # byte_fallback: any text encodes, also characters the training text never had.
        # hard_vocab_limit off: a small corpus gets a smaller vocabulary instead of an error.
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
            character_coverage=1.0, byte_fallback=True, hard_vocab_limit=False,
            pad_id=-1, unk_id=0, bos_id=1, eos_id=2, minloglevel=2)
    finally:
        os.unlink(corpus)
    return prefix + ".model"


def build(args):
    if (args.vocab_size is None) == (args.tokenizer is None):
        sys.exit("error: give --vocab-size N (train a tokenizer on the inputs) or --tokenizer FILE.model (use one)")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    if args.tokenizer:
        model_file = args.tokenizer
        if not os.path.isfile(model_file):
            sys.exit(f"error: tokenizer {model_file} does not exist")
    else:
        if args.vocab_size < 260:
            sys.exit(f"error: --vocab-size {args.vocab_size} is too small: byte fallback alone takes 256 ids + 4 special")
        model_file = train_tokenizer(args.inputs, args.jsonl_key, args.vocab_size, args.out)
    sp = spm.SentencePieceProcessor(model_file=model_file)
    vocab = sp.get_piece_size()
    separator = None
    if args.separator == "eos":
        separator = sp.eos_id()
        if separator < 0:
            sys.exit("error: the tokenizer has no end-of-text id; use --separator none")
    width = 2 if vocab <= 1 << 16 else 4
    code = "<H" if width == 2 else "<I"
    tokens_file, docs_file = args.out + ".tokens", args.out + ".docs"
    num_tokens = documents = 0
    with open(tokens_file, "wb") as tok, open(docs_file, "wb") as docs:
        for _, text in read_documents(args.inputs, args.jsonl_key):
            ids = sp.encode(text)
            if separator is not None:
                ids.append(separator)
            if not ids:
                continue
            docs.write(struct.pack("<Q", num_tokens))
            tok.write(struct.pack(f"{code[0]}{len(ids)}{code[1]}", *ids))
            num_tokens += len(ids)
            documents += 1
    if num_tokens < 2:
        sys.exit("error: the inputs hold fewer than 2 tokens: nothing to train on")
    manifest = {
        "format": FORMAT, "version": 1,
        "tokens": os.path.basename(tokens_file), "token_width": width,
        "vocab_size": vocab, "num_tokens": num_tokens,
        "documents": documents, "separator": separator, "document_starts": os.path.basename(docs_file),
        "tokenizer": {"kind": "sentencepiece", "model": os.path.relpath(os.path.abspath(model_file), out_dir),
                      "bos_id": sp.bos_id(), "eos_id": sp.eos_id()},
    }
    with open(args.out + ".json", "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print(f"{documents} documents, {num_tokens} tokens, vocab {vocab} ({'uint16' if width == 2 else 'uint32'} ids)"
          f" -> {args.out}.json")
    print(f"train with: stateflow train --data tokens --data-path {args.out}.json")


def load_tokenizer(manifest_path):
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"error: cannot read manifest {manifest_path}: {e}")
    tok = manifest.get("tokenizer", {})
    if manifest.get("format") != FORMAT or tok.get("kind") != "sentencepiece":
        sys.exit(f"error: {manifest_path} is not a manifest of this tool with a SentencePiece tokenizer")
    model = os.path.join(os.path.dirname(os.path.abspath(manifest_path)), tok["model"])
    return spm.SentencePieceProcessor(model_file=model)


def encode(args):
    sp = load_tokenizer(args.manifest)
    text = sys.stdin.read() if args.text == "-" else args.text
    print(" ".join(str(i) for i in sp.encode(text)))


def decode(args):
    sp = load_tokenizer(args.manifest)
    words = (sys.stdin.read() if not args.ids else " ".join(args.ids)).split()
    try:
        ids = [int(w) for w in words]
    except ValueError:
        sys.exit("error: decode takes whitespace-separated integer token ids")
    print(sp.decode(ids))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="tokenize text/JSONL files into token files and a manifest")
    b.add_argument("inputs", nargs="+", help="text files (one document each) and .jsonl files (one a line)")
    b.add_argument("--out", required=True, help="output prefix: PREFIX.tokens, .docs, .json (and .model)")
    b.add_argument("--vocab-size", type=int, help="train a SentencePiece BPE tokenizer of at most this many ids")
    b.add_argument("--tokenizer", help="use this SentencePiece model instead of training one")
    b.add_argument("--separator", choices=["eos", "none"], default="eos",
                   help="after each document: the end-of-text id (default) or nothing")
    b.add_argument("--jsonl-key", default="text", help="field holding a .jsonl record's text (default: text)")
    b.set_defaults(run=build)
    e = sub.add_parser("encode", help="print the token ids of a text ('-': standard input)")
    e.add_argument("--manifest", required=True)
    e.add_argument("text")
    e.set_defaults(run=encode)
    d = sub.add_parser("decode", help="print the text of token ids (arguments or standard input)")
    d.add_argument("--manifest", required=True)
    d.add_argument("ids", nargs="*")
    d.set_defaults(run=decode)
    args = p.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
