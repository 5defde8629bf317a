# Sourced by the tools/gpu/run_*.sh scripts (from the repo root).
#
# find_cublaslt: the binaries link cuBLASLt dynamically (libcublasLt.so.13, ~0.5 GiB, never
# staged); put the GPU machine's own copy on LD_LIBRARY_PATH: the loader cache, the CUDA toolkit,
# Python's nvidia-* wheels (torch bundles one), then a file-system search. Returns 1 when none.
find_cublaslt() {
  ldconfig -p 2>/dev/null | grep -q 'libcublasLt.so.13 ' && return 0
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    if [[ -e $d/libcublasLt.so.13 ]]; then
      LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      export LD_LIBRARY_PATH
      return 0
    fi
  done
  local f
  f=$(python3 - <<'PY' 2>/dev/null
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for r in roots:
    for f in glob.glob(r + "/nvidia/**/libcublasLt.so.13*", recursive=True):
        print(f); raise SystemExit
PY
  )
  [[ -z $f ]] && f=$(find / -xdev -name 'libcublasLt.so.13*' 2>/dev/null | head -n 1)
  [[ -z $f ]] && return 1
  LD_LIBRARY_PATH=$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
}
