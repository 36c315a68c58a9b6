#!/usr/bin/env bash
# End-to-end checks of the document KV store with the infoflow_sp binary, the real model and
# real HDF5 files, run by CTest:   store_cli_test.sh BIN MPIEXEC CASE
# CASE: query      - cache-build (f16) then the demo question from the store: same selected set
#                    as without the store, logits within tolerance, tokens-from-store and the
#                    store_load phase reported; an f32 store built on 2 ranks gives bit-identical
#                    logits, selected set and answer; read-write adds missing documents
#       h5py       - h5py reads the store: identity attributes, shapes, dtypes, checksum filter,
#                    f16 values equal numpy's rounding of the f32 store's values
#       kill       - kill -9 of cache-build while it writes a document: the store opens, every
#                    complete document reads, the re-run rebuilds only the missing ones
#       refuse     - another model fingerprint / format version is refused naming the file and
#                    attribute; a flipped byte in a K dataset is detected and named
#       fullfs     - a store on a full file system (small tmpfs) fails cleanly and the previous
#                    store stays intact (skipped, exit 77, where tmpfs cannot be mounted)
#       concurrent - two cache-build processes adding to one store at once both succeed and the
#                    store holds every document
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../clock.sh"
bin="$1"; mpiexec="$2"; case_name="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
tmp="$(mktemp -d)"
mnt=""
cleanup() {
    if [ -n "$mnt" ]; then umount "$mnt" 2>/dev/null; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_WAIT_POLICY=passive
fail() { echo "FAIL: $*"; exit 1; }
# Debian's interpreter carries python3-h5py (launch/setup.sh).
py=/usr/bin/python3
$py -c "import h5py" 2>/dev/null || fail "python3-h5py is not installed (run launch/setup.sh)"

build() {  # build STORE DTYPE [extra --set ...]
    local store="$1" dtype="$2"; shift 2
    "$bin" --config configs/cache-build-demo.toml \
        --set model.threads="${INFOFLOW_STORE_TEST_THREADS:-2}" --set store.path="$store" \
        --set model.weights="${INFOFLOW_STORE_TEST_WEIGHTS:-native}" \
        --set store.dtype="$dtype" "$@" > "$tmp/build.txt" 2>&1 \
        || { cat "$tmp/build.txt"; fail "cache-build exited non-zero"; }
    cat "$tmp/build.txt"
}
ask() {  # ask OUT.json [extra --set ...]
    local out="$1"; shift
    "$bin" --config configs/store-demo.toml \
        --set model.threads="${INFOFLOW_STORE_TEST_THREADS:-2}" --set decode.max_new_tokens=12 \
        --set model.weights="${INFOFLOW_STORE_TEST_WEIGHTS:-native}" \
        --out "$out" "$@" > "$tmp/ask.txt" 2>&1 || { cat "$tmp/ask.txt"; fail "answer exited non-zero"; }
    cat "$tmp/ask.txt"
}

case "$case_name" in
query)
    # fp32 weights (the engine's exact reference): the claims are the store's. (With native
    # weights, when decode-sized calls still took 8-bit activations, the f16 store's rounding
    # moved a near-tied score across the selection cut-off.)
    export INFOFLOW_STORE_TEST_WEIGHTS=f32
    # fp32 weights take the exact pass, whose bits do not depend on the thread count: the
    # 2-rank cache-build below runs one thread per rank, the questions two.
    build "$tmp/f16.h5" f16
    grep -q "4 added, 0 already present" "$tmp/build.txt" || fail "cache-build did not add 4 documents"
    ask "$tmp/fresh.json" --set store.path=""
    ask "$tmp/f16.json" --set store.path="$tmp/f16.h5"
    # f32 store built on 2 ranks (documents divided among them).
    "$mpiexec" -n 2 --oversubscribe "$bin" --config configs/cache-build-demo.toml \
        --set model.threads=1 --set store.path="$tmp/f32.h5" --set store.dtype=f32 \
        --set model.weights=f32 \
        > "$tmp/b2.txt" 2>&1 || { cat "$tmp/b2.txt"; fail "2-rank cache-build failed"; }
    cat "$tmp/b2.txt"
    ask "$tmp/f32.json" --set store.path="$tmp/f32.h5" --set store.dtype=f32
    # read-write on an empty store: everything prefilled, then added; the next run loads it all.
    ask "$tmp/rw1.json" --set store.path="$tmp/rw.h5" --set store.mode=read-write --set store.dtype=f32
    ask "$tmp/rw2.json" --set store.path="$tmp/rw.h5" --set store.dtype=f32
    python3 - "$tmp" <<'PY' || exit 1
import json, sys
t = sys.argv[1]
fresh, f16, f32 = (json.load(open(f"{t}/{n}.json")) for n in ("fresh", "f16", "f32"))
rw1, rw2 = (json.load(open(f"{t}/{n}.json")) for n in ("rw1", "rw2"))
ctx = fresh["context_tokens"]
names = lambda r: [p["name"] for p in r["phases"]]
assert "store_load" not in names(fresh), names(fresh)
for r in (f16, f32, rw2):
    assert "store_load" in names(r), names(r)
    docs = r["store"]["tokens"]
    assert 0 < docs < ctx and r["store"]["chunks"] == 4, r["store"]
assert fresh["store"]["tokens"] == 0
# f32: bit-identical to the fresh run.
for r in (f32, rw2, rw1):
    assert r["selected_positions"] == fresh["selected_positions"]
    assert r["first_token_top"] == fresh["first_token_top"], (r["first_token_top"][:3], fresh["first_token_top"][:3])
    assert r["answer"]["token_ids"] == fresh["answer"]["token_ids"]
assert rw1["store"]["tokens"] == 0 and rw1["store"]["added"] == 4, rw1["store"]
# f16: same selected set; logits within 1e-3 of the top logit's magnitude (half keeps 11 bits
# per K/V value, the errors average out over the attention sums; measured ~5e-5; see
# tests/store/mpi/test_store_sp.cpp); 1e-2 on the amx path, whose bf16 products turn those
# errors into whole bf16 steps here and there (docs/design.md §6, "Numerics per CPU path").
assert f16["selected_positions"] == fresh["selected_positions"], "f16 selected set differs"
a = {e["id"]: e["logit"] for e in f16["first_token_top"]}
b = {e["id"]: e["logit"] for e in fresh["first_token_top"]}
assert f16["first_token_top"][0]["id"] == fresh["first_token_top"][0]["id"]
scale = max(abs(v) for v in b.values())
err = max(abs(a[i] - b[i]) for i in b if i in a) / scale
print(f"f16 max relative logit error over the shared top-20: {err:.2e}")
bar = 1e-2 if f16["provenance"]["host"]["cpu"]["isa"].startswith("amx") else 1e-3
assert err <= bar, (err, bar)
print("ok: store answers equal the fresh run;", repr(f16["answer"]["text"]))
PY
    ;;
h5py)
    build "$tmp/f16.h5" f16
    build "$tmp/f32.h5" f32
    $py - "$tmp" <<'PY' || exit 1
import sys, h5py, numpy as np
t = sys.argv[1]
for name, dt in (("f16", np.float16), ("f32", np.float32)):
    f = h5py.File(f"{t}/{name}.h5", "r")
    a = f.attrs
    assert a["format"] == "infoflow_sp kv store" and a["format_version"] == 1
    assert a["arch"] == "llama" and a["n_layer"] == 30 and a["n_head_kv"] == 3 and a["head_dim"] == 64
    assert a["dtype"] == name and a["keys"] == "post-rope" and a["rope"] == "neox"
    assert len(a["model_fingerprint"]) == 16 and len(a["tokenizer_hash"]) == 16
    docs = f["documents"]
    assert len(docs) == 4 and a["n_documents"] == 4
    for key, d in docs.items():
        n = int(d.attrs["n_tokens"])
        assert d.attrs["key"] == key and d.attrs["complete"] == 1 and d.attrs["chunking"] == "passage"
        assert d.attrs["model_fingerprint"] == a["model_fingerprint"]
        assert d["tokens"].shape == (n,) and d["tokens"].dtype == np.int32
        assert list(d["positions"][:]) == list(range(1, n + 1))  # after the sink
        for l in range(30):
            for kv in ("k", "v"):
                x = d[f"layer_{l:03d}/{kv}"]
                assert x.shape == (n, 3, 64) and x.dtype == dt, (x.shape, x.dtype)
                assert x.fletcher32 and x.chunks is not None
    print(f"ok: {name}: 4 documents,", ", ".join(f"{k}: {v['tokens'].shape[0]} tokens" for k, v in docs.items()))
# The f16 values are numpy's round-to-nearest of the f32 values (an independent conversion).
f16, f32 = h5py.File(f"{t}/f16.h5", "r")["documents"], h5py.File(f"{t}/f32.h5", "r")["documents"]
assert sorted(f16) == sorted(f32)
for key in f16:
    for l in (0, 17, 29):
        for kv in ("k", "v"):
            ref = f32[key][f"layer_{l:03d}/{kv}"][:].astype(np.float16)
            got = f16[key][f"layer_{l:03d}/{kv}"][:]
            assert np.array_equal(ref.view(np.uint16), got.view(np.uint16)), (key, l, kv)
print("ok: f16 = numpy float16(f32) bit for bit")
PY
    ;;
kill)
    # Four documents of ~900 tokens, f32 (~42 MB per document file): the write takes long
    # enough to be caught mid-way.
    mkdir -p "$tmp/docs"
    python3 - "$tmp/docs" <<'PY'
import sys
words = open("configs/data/filler.txt").read().split()
for i in range(4):
    open(f"{sys.argv[1]}/{i:02d}.txt", "w").write(f"Part {i}. " + " ".join(words[i * 700:(i + 1) * 700]))
PY
    store="$tmp/kill.h5"
    "$bin" --config configs/cache-build-demo.toml --set model.threads=2 --set store.path="$store" \
        --set model.weights="${INFOFLOW_STORE_TEST_WEIGHTS:-native}" \
        --set store.dtype=f32 --set request.documents_file="$tmp/docs/" > "$tmp/k1.txt" 2>&1 &
    pid=$!
    # Wait (up to 10 min) until one document is committed and the next one's temp file is being
    # written, then kill -9.
    caught=""
    deadline=$(( $(mono_i) + 600 ))
    while [ "$(mono_i)" -lt "$deadline" ] && kill -0 "$pid" 2>/dev/null; do
        n_done=$(ls "$store.d" 2>/dev/null | grep -c '^[0-9a-f]*\.h5$')
        t=$(ls -a "$store.d" 2>/dev/null | grep '\.tmp\.' | head -n 1)
        if [ "$n_done" -ge 1 ] && [ -n "$t" ] && [ "$(stat -c %s "$store.d/$t" 2>/dev/null || echo 0)" -gt 100000 ]; then
            # Stop the writer first, then look again: on a fast machine the write can finish
            # between the look and the signal. If it did, let it go on to the next document.
            kill -STOP "$pid"
            if [ -e "$store.d/$t" ]; then
                kill -9 "$pid"; caught="$t"; break
            fi
            kill -CONT "$pid"
        fi
        sleep 0.01
    done
    [ -n "$caught" ] || kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    cat "$tmp/k1.txt"
    [ -n "$caught" ] || fail "the kill did not land mid-document"
    [ -e "$store.d/$caught" ] || fail "the temp file $caught was complete before the kill (retry)"
    echo "killed while writing $caught"
    $py - "$store" <<'PY' || exit 1
import sys, h5py
f = h5py.File(sys.argv[1], "r")
docs = f["documents"]
n = len(docs)
assert 1 <= n < 4, n
for key, d in docs.items():
    assert d.attrs["complete"] == 1
    for l in range(30):
        d[f"layer_{l:03d}/k"][:]; d[f"layer_{l:03d}/v"][:]   # every checksum verified
print(f"ok: after kill -9 the store opens with {n} complete documents, all readable")
open(sys.argv[1] + ".count", "w").write(str(n))
PY
    n=$(cat "$store.count")
    "$bin" --config configs/cache-build-demo.toml --set model.threads=2 --set store.path="$store" \
        --set model.weights="${INFOFLOW_STORE_TEST_WEIGHTS:-native}" \
        --set store.dtype=f32 --set request.documents_file="$tmp/docs/" > "$tmp/k2.txt" 2>&1 \
        || { cat "$tmp/k2.txt"; fail "the re-run failed"; }
    cat "$tmp/k2.txt"
    grep -q "4 documents in total, $((4 - n)) added, $n already present" "$tmp/k2.txt" \
        || fail "the re-run did not rebuild exactly the missing documents"
    if ls -a "$store.d" | grep -q '\.tmp\.'; then fail "a temp file was left behind"; fi
    echo "ok: rebuilt $((4 - n)) missing documents, temp file removed"
    ;;
refuse)
    build "$tmp/s.h5" f16
    ask "$tmp/ok.json" --set store.path="$tmp/s.h5"
    expect_error() {  # expect_error PATTERN... (the last run must fail with every pattern)
        if "$bin" --config configs/store-demo.toml --set model.threads=2 --set store.path="$tmp/bad.h5" \
            --set decode.max_new_tokens=2 > "$tmp/err.txt" 2>&1; then
            cat "$tmp/err.txt"; fail "a bad store was accepted"
        fi
        cat "$tmp/err.txt"
        for p in "$@"; do grep -q -- "$p" "$tmp/err.txt" || fail "message lacks '$p'"; done
    }
    copy() { rm -rf "$tmp/bad.h5" "$tmp/bad.h5.d"; cp "$tmp/s.h5" "$tmp/bad.h5"; cp -r "$tmp/s.h5.d" "$tmp/bad.h5.d"; }
    copy
    $py -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); f.attrs['model_fingerprint']='0123456789abcdef'" "$tmp/bad.h5"
    expect_error "$tmp/bad.h5" "model_fingerprint" "refused"
    copy
    $py -c "import h5py,sys,numpy as np; f=h5py.File(sys.argv[1],'r+'); f.attrs['format_version']=np.int64(2)" "$tmp/bad.h5"
    expect_error "$tmp/bad.h5" "format_version 2"
    copy
    key=$($py - "$tmp/bad.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
key = sorted(f["documents"])[0]
d = f["documents"][key]["layer_007/k"]
off = d.id.get_chunk_info(0).byte_offset
path = sys.argv[1] + ".d/" + key + ".h5"
f.close()
with open(path, "r+b") as g:
    g.seek(off + 1001); b = g.read(1); g.seek(off + 1001); g.write(bytes([b[0] ^ 0x40]))
print(key)
PY
)
    expect_error "$key" "layer_007/k" "checksum"
    echo "ok: refused, and the flipped byte was named"
    ;;
fullfs)
    mnt="$tmp/mnt"
    mkdir -p "$mnt"
    if ! mount -t tmpfs -o size=3m tmpfs "$mnt" 2>"$tmp/mount.txt"; then
        cat "$tmp/mount.txt"; mnt=""; echo "SKIP: cannot mount a tmpfs here (needs root)"; exit 77
    fi
    # One document (~1.6 MB in f16) fits; the other three do not.
    mkdir -p "$tmp/one" && cp configs/data/marrowby/01.txt "$tmp/one/"
    build "$mnt/s.h5" f16 --set request.documents_file="$tmp/one/"
    before=$($py -c "import h5py,sys; print(sorted(h5py.File(sys.argv[1],'r')['documents']))" "$mnt/s.h5")
    if "$bin" --config configs/cache-build-demo.toml --set model.threads=2 --set store.path="$mnt/s.h5" \
        > "$tmp/full.txt" 2>&1; then
        cat "$tmp/full.txt"; fail "writing to a full file system succeeded"
    fi
    cat "$tmp/full.txt"
    grep -q "$mnt/s.h5" "$tmp/full.txt" || fail "the error does not name the store"
    ls -la "$mnt" "$mnt/s.h5.d"
    if ls -a "$mnt" "$mnt/s.h5.d" | grep -q '\.tmp\.'; then fail "a temp file was left behind"; fi
    $py - "$mnt/s.h5" "$before" <<'PY' || exit 1
import sys, h5py, ast
f = h5py.File(sys.argv[1], "r")
before = ast.literal_eval(sys.argv[2])
now = sorted(f["documents"])
assert set(before) <= set(now), (before, now)
for key in now:
    for l in range(30):
        f["documents"][key][f"layer_{l:03d}/k"][:]; f["documents"][key][f"layer_{l:03d}/v"][:]
print(f"ok: full file system: store intact ({len(before)} document(s) before, {len(now)} now, all readable)")
PY
    ;;
concurrent)
    mkdir -p "$tmp/a" "$tmp/b"
    cp configs/data/marrowby/01.txt configs/data/marrowby/02.txt "$tmp/a/"
    cp configs/data/marrowby/03.txt configs/data/marrowby/04.txt configs/data/marrowby/02.txt "$tmp/b/"
    for s in a b; do
        "$bin" --config configs/cache-build-demo.toml --set model.threads=1 --set store.path="$tmp/c.h5" \
            --set request.documents_file="$tmp/$s/" > "$tmp/$s.txt" 2>&1 &
        eval "pid_$s=$!"
    done
    wait "$pid_a"; ra=$?
    wait "$pid_b"; rb=$?
    cat "$tmp/a.txt" "$tmp/b.txt"
    [ "$ra" -eq 0 ] && [ "$rb" -eq 0 ] || fail "a concurrent writer failed ($ra, $rb)"
    $py - "$tmp/c.h5" <<'PY' || exit 1
import sys, h5py
f = h5py.File(sys.argv[1], "r")
assert len(f["documents"]) == 4, sorted(f["documents"])
for key, d in f["documents"].items():
    for l in range(30):
        d[f"layer_{l:03d}/k"][:]
print("ok: two concurrent writers, 4 documents, all readable")
PY
    ask "$tmp/c.json" --set store.path="$tmp/c.h5"
    ;;
*) fail "unknown case $case_name" ;;
esac
