#!/usr/bin/env bash
# deploy_test: deploy/install.sh into scratch roots, the installed systemd units through
# `systemd-analyze verify`, and shellcheck over the deploy scripts.
#
#   tests/deploy/deploy_test.sh --bin-dir BUILD_DIR
#
# BUILD_DIR holds the built glm-agent, glm-controller and glmctl (ctest passes the build root).
# Needs systemd-analyze, shellcheck and /bin/kill: tools/install-deps.sh installs the packages
# systemd, shellcheck and procps. Runs unprivileged too; owner checks then print SKIP. One PASS/FAIL
# line per check; exit status 1 when any check failed, 2 for a usage error.
set -euo pipefail

repo_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
install_sh="${repo_dir}/deploy/install.sh"
units_dir="${repo_dir}/deploy/systemd"

bin_dir=""
while (($#)); do
  case "$1" in
    --bin-dir) bin_dir="${2:-}"; shift 2 || shift ;;
    --bin-dir=*) bin_dir="${1#*=}"; shift ;;
    -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "deploy_test: unknown argument '$1'; usage: deploy_test.sh --bin-dir BUILD_DIR" >&2; exit 2 ;;
  esac
done
[[ -n "${bin_dir}" ]] || { echo "deploy_test: --bin-dir BUILD_DIR is required" >&2; exit 2; }

failures=0
pass() { echo "PASS: $1"; }
fail() {
  echo "FAIL: $1"
  shift
  local line
  for line in "$@"; do echo "      ${line}"; done
  failures=$((failures + 1))
}
skip() { echo "SKIP: $1"; }

scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT

# ---- Tools -------------------------------------------------------------------------------------
tools_ok=1
for tool in systemd-analyze shellcheck; do
  if ! command -v "${tool}" >/dev/null; then
    fail "tool ${tool} present" "install it: tools/install-deps.sh (apt-get install systemd shellcheck procps)"
    tools_ok=0
  fi
done
((tools_ok)) && pass "tools systemd-analyze and shellcheck present"

for b in glm-agent glm-controller glmctl; do
  if [[ ! -x "${bin_dir}/${b}" ]]; then
    fail "binary ${b} in ${bin_dir}" "build it: cmake --build ${bin_dir} --target ${b}"
  fi
done

# ---- shellcheck --------------------------------------------------------------------------------
if command -v shellcheck >/dev/null; then
  for script in "${install_sh}" "${BASH_SOURCE[0]}"; do
    if out="$(shellcheck "${script}" 2>&1)"; then
      pass "shellcheck $(basename "${script}")"
    else
      fail "shellcheck $(basename "${script}")" "${out}"
    fi
  done
fi

# ---- systemd-analyze verify ----------------------------------------------------------------------
# verify_unit FILE: `systemd-analyze verify` exits 0 and says nothing about FILE. An unknown
# directive or a bad value is only a warning ("Unknown key ..., ignoring") with exit status 0,
# so any line naming the unit counts as a failure. Output goes to verify_out.
verify_out=""
verify_unit() {
  local name rc=0
  name="$(basename "$1")"
  verify_out="$(systemd-analyze verify "$1" 2>&1)" || rc=$?
  ((rc == 0)) && ! grep -qF "${name}" <<<"${verify_out}"
}

# A copy of an installed unit whose binaries point into ROOT, so ExecStart= resolves (verify
# checks that it is executable). Everything else is the installed file as it is.
rooted_copy() {
  local unit="$1" root="$2" dest_dir="$3"
  mkdir -p "${dest_dir}"
  sed "s#=/usr/local/bin/#=${root}/usr/local/bin/#g" "${root}/etc/systemd/system/${unit}" \
    >"${dest_dir}/${unit}"
  echo "${dest_dir}/${unit}"
}

# ---- install.sh: first run ---------------------------------------------------------------------
root1="${scratch}/root1"
mkdir -p "${root1}/etc"
printf 'root:x:0:0:root:/root:/bin/bash\nsystemd-network:x:999:999::/:/usr/sbin/nologin\n' \
  >"${root1}/etc/passwd"
printf 'root:x:0:\nsystemd-network:x:999:\n' >"${root1}/etc/group"
run1_rc=0
run1="$("${install_sh}" --root "${root1}" --bin-dir "${bin_dir}" --role both 2>&1)" || run1_rc=$?
if ((run1_rc == 0)); then pass "install.sh --root (first run) exits 0"; else
  fail "install.sh --root (first run) exits 0" "exit ${run1_rc}" "${run1}"; fi

# expect_attrs PATH TYPE MODE [OWNER_UID OWNER_GID]
expect_attrs() {
  local path="$1" type="$2" mode="$3" want_uid="${4:-}" want_gid="${5:-}"
  local name="${path#"${root1}"}"
  if [[ "${type}" == d && ! -d "${path}" ]] || [[ "${type}" == f && ! -f "${path}" ]]; then
    fail "${name} installed" "missing: ${path}"
    return 0
  fi
  local have
  have="$(stat -c '%a' "${path}")"
  if [[ "${have}" == "${mode}" ]]; then pass "${name} mode ${mode}"; else
    fail "${name} mode ${mode}" "mode is ${have}"; fi
  [[ -n "${want_uid}" ]] || return 0
  if [[ "$(id -u)" -ne 0 ]]; then
    skip "${name} owner (not root: install.sh sets no owners)"
    return 0
  fi
  have="$(stat -c '%u:%g' "${path}")"
  if [[ "${have}" == "${want_uid}:${want_gid}" ]]; then pass "${name} owner ${have}"; else
    fail "${name} owner ${want_uid}:${want_gid}" "owner is ${have}"; fi
}

passwd_line="$(grep '^glm:' "${root1}/etc/passwd" || true)"
group_line="$(grep '^glm:' "${root1}/etc/group" || true)"
IFS=: read -r _ _ glm_uid glm_gid _ glm_home glm_shell <<<"${passwd_line}"
IFS=: read -r _ _ group_gid _ <<<"${group_line}"
if [[ -n "${passwd_line}" && "${glm_home}" == /var/lib/glm && "${glm_shell}" == */nologin ]] &&
  ((glm_uid >= 100 && glm_uid < 1000)) && [[ "${glm_gid}" == "${group_gid}" ]]; then
  pass "passwd/group: system user glm (uid ${glm_uid}, gid ${glm_gid}, nologin, home /var/lib/glm)"
else
  fail "passwd/group: system user glm" "passwd: ${passwd_line:-(none)}" "group: ${group_line:-(none)}"
fi
if [[ "$(grep -c '^systemd-network:' "${root1}/etc/passwd")" == 1 && "${glm_uid}" != 999 ]]; then
  pass "passwd: existing entries kept, uid 999 (taken) not reused"
else
  fail "passwd: existing entries kept, uid 999 (taken) not reused" "$(cat "${root1}/etc/passwd")"
fi

for b in glm-agent glm-controller glmctl; do
  expect_attrs "${root1}/usr/local/bin/${b}" f 755 0 0
  if cmp -s "${bin_dir}/${b}" "${root1}/usr/local/bin/${b}"; then pass "/usr/local/bin/${b} is the built binary"; else
    fail "/usr/local/bin/${b} is the built binary" "differs from ${bin_dir}/${b}"; fi
done
expect_attrs "${root1}/etc/glm" d 750 0 "${glm_gid}"
expect_attrs "${root1}/var/lib/glm" d 750 "${glm_uid}" "${glm_gid}"
for unit in glm-agent.service glm-controller.service; do
  expect_attrs "${root1}/etc/systemd/system/${unit}" f 644 0 0
  if cmp -s "${units_dir}/${unit}" "${root1}/etc/systemd/system/${unit}"; then
    pass "${unit} installed as in deploy/systemd (default prefix)"
  else
    fail "${unit} installed as in deploy/systemd (default prefix)" "differs"
  fi
done
for env in agent.env controller.env; do
  expect_attrs "${root1}/etc/glm/${env}" f 640 0 "${glm_gid}"
done

# The flags the units and the env template pass exist in the binaries' --help.
flags_known() {
  local help="$1" flags="$2" flag missing=()
  for flag in ${flags}; do
    grep -qE -- "(^|[ ,])${flag}( |$)" <<<"${help}" || missing+=("${flag}")
  done
  ((${#missing[@]} == 0)) || { echo "unknown flags: ${missing[*]}"; return 1; }
}
if [[ -x "${bin_dir}/glm-agent" && -x "${bin_dir}/glm-controller" ]]; then
  agent_help="$("${bin_dir}/glm-agent" serve --help 2>&1 || true)"
  controller_help="$("${bin_dir}/glm-controller" --help 2>&1 || true)"
  example="$(grep '^#GLM_AGENT_ARGS=' "${root1}/etc/glm/agent.env" || true)"
  agent_flags="$(grep -oE -- '--[a-z-]+' <<<"${example}" | sort -u | tr '\n' ' ')"
  controller_flags="$(grep '^ExecStart=' "${units_dir}/glm-controller.service" | grep -oE -- '--[a-z-]+' | sort -u | tr '\n' ' ')"
  if [[ -n "${agent_flags}" ]] && out="$(flags_known "${agent_help}" "${agent_flags}")"; then
    pass "agent.env example flags exist in glm-agent serve --help (${agent_flags% })"
  else
    fail "agent.env example flags exist in glm-agent serve --help" "${out:-no example line}"
  fi
  if [[ -n "${controller_flags}" ]] && out="$(flags_known "${controller_help}" "${controller_flags}")"; then
    pass "glm-controller.service flags exist in glm-controller --help (${controller_flags% })"
  else
    fail "glm-controller.service flags exist in glm-controller --help" "${out:-no flags in ExecStart}"
  fi
fi

# ---- systemd-analyze verify on the installed units --------------------------------------------
if command -v systemd-analyze >/dev/null; then
  for unit in glm-agent.service glm-controller.service; do
    copy="$(rooted_copy "${unit}" "${root1}" "${scratch}/verify")"
    if verify_unit "${copy}"; then pass "systemd-analyze verify ${unit}"; else
      fail "systemd-analyze verify ${unit}" "${verify_out}"; fi
  done
  # The check itself: a misspelt directive, a bad value and a missing binary must each be caught.
  base="${scratch}/verify/glm-agent.service"
  n=0
  for edit in 's/^ProtectHome=yes/ProtectHomee=yes/' 's/^Restart=on-failure/Restart=sometimes/' \
    "s#^ExecStart=[^ ]*#ExecStart=${scratch}/no-such-binary#"; do
    n=$((n + 1))
    mkdir -p "${scratch}/broken${n}"
    sed "${edit}" "${base}" >"${scratch}/broken${n}/glm-agent.service"
    if cmp -s "${base}" "${scratch}/broken${n}/glm-agent.service"; then
      fail "verify rejects a broken unit (${edit})" "the edit changed nothing; update the test"
    elif verify_unit "${scratch}/broken${n}/glm-agent.service"; then
      fail "verify rejects a broken unit (${edit})" "systemd-analyze said: ${verify_out:-nothing}"
    else
      pass "verify rejects a broken unit (${edit})"
    fi
  done
fi

# ---- Containerfile: its apt list covers what the binaries link --------------------------------
# Every shared library of the built binaries that a Debian package owns must come from a package
# the Containerfile installs (or from debian:12 itself); libraries no package owns (CUDA's
# libcublasLt) go into the build context's lib/.
containerfile="${repo_dir}/deploy/container/Containerfile"
if command -v dpkg >/dev/null && command -v ldd >/dev/null && [[ -x "${bin_dir}/glm-agent" ]]; then
  listed=" libc6 libgcc-s1 libstdc++6 $(sed -n '/apt-get install/,/rm -rf/p' "${containerfile}" |
    tr -s ' \\\n' ' ') "
  libs=()
  for b in glm-agent glm-controller glmctl; do
    [[ -x "${bin_dir}/${b}" ]] || continue
    while read -r lib; do
      # usrmerge: dpkg knows a file under one of /lib/... and /usr/lib/....
      libs+=("${lib}" "$(readlink -f "${lib}")" "/usr${lib}" "${lib#/usr}")
    done < <(ldd "${bin_dir}/${b}" | awk '/=> \// {print $3}')
  done
  mapfile -t libs < <(printf '%s\n' "${libs[@]}" | sort -u)
  missing_pkgs=()
  # One dpkg -S over every path ("pkg[:arch]: /path" per owned one; the rest are unowned).
  while IFS= read -r line; do
    owner="${line%%: *}"
    owner="${owner%%:*}"
    [[ "${listed}" == *" ${owner} "* ]] || missing_pkgs+=("${owner} (${line#*: })")
  done < <(dpkg -S "${libs[@]}" 2>/dev/null | grep -v '^diversion' || true)
  if ((${#missing_pkgs[@]} == 0)); then
    pass "Containerfile installs the Debian packages of every library the binaries link"
  else
    mapfile -t missing_pkgs < <(printf '%s\n' "${missing_pkgs[@]}" | sort -u)
    fail "Containerfile installs the Debian packages of every library the binaries link" \
      "add to deploy/container/Containerfile: ${missing_pkgs[*]}"
  fi
else
  skip "Containerfile package list (no dpkg/ldd)"
fi

# ---- install.sh: second run changes nothing, keeps the operator's files ------------------------
snapshot() {
  (cd "$1" && find . -printf '%p %y %m %u:%g %s\n' | sort && find . -type f -exec sha256sum {} + | sort)
}
echo 'GLM_AGENT_ARGS="--listen 0.0.0.0:47101 --node edited-by-operator"' >>"${root1}/etc/glm/agent.env"
echo 'GLM_CONTROLLER_ARGS="--log-level debug"' >"${root1}/etc/glm/controller.env"
before="$(snapshot "${root1}")"
run2_rc=0
run2="$("${install_sh}" --root "${root1}" --bin-dir "${bin_dir}" --role both 2>&1)" || run2_rc=$?
after="$(snapshot "${root1}")"
if ((run2_rc == 0)); then pass "install.sh --root (second run) exits 0"; else
  fail "install.sh --root (second run) exits 0" "exit ${run2_rc}" "${run2}"; fi
if grep -q 'nothing changed' <<<"${run2}" && ! grep -qE '^install.sh: (install|update|create|add|chmod|chown) ' <<<"${run2}"; then
  pass "second run reports nothing changed"
else
  fail "second run reports nothing changed" "${run2}"
fi
if [[ "${before}" == "${after}" ]]; then
  pass "second run leaves every file, mode and owner as it was (operator's env files kept)"
else
  fail "second run leaves every file as it was" "$(diff <(echo "${before}") <(echo "${after}") || true)"
fi

# ---- install.sh: a changed mode is repaired, --dry-run and --prefix, errors ---------------------
chmod 0644 "${root1}/etc/glm/agent.env"
run3="$("${install_sh}" --root "${root1}" --bin-dir "${bin_dir}" 2>&1 || true)"
if [[ "$(stat -c '%a' "${root1}/etc/glm/agent.env")" == 640 ]] && grep -q 'chmod 0640' <<<"${run3}" &&
  grep -q 'edited-by-operator' "${root1}/etc/glm/agent.env"; then
  pass "a loosened agent.env mode is set back to 0640, content kept"
else
  fail "a loosened agent.env mode is set back to 0640, content kept" "${run3}"
fi

root2="${scratch}/root2"
mkdir -p "${root2}"
dry_rc=0
dry="$("${install_sh}" --root "${root2}" --bin-dir "${bin_dir}" --dry-run 2>&1)" || dry_rc=$?
left="$(find "${root2}" -mindepth 1 | tr '\n' ' ')"
if ((dry_rc == 0)) && [[ -z "${left}" ]] && grep -q '^install.sh: would install .*/glm-agent.service' <<<"${dry}"; then
  pass "--dry-run lists the changes and writes nothing"
else
  fail "--dry-run lists the changes and writes nothing" "exit ${dry_rc}; written: ${left:-nothing}" "${dry}"
fi

root3="${scratch}/root3"
mkdir -p "${root3}"
if "${install_sh}" --root "${root3}" --bin-dir "${bin_dir}" --role agent --prefix /opt/glm >/dev/null 2>&1 &&
  grep -q '^ExecStart=/opt/glm/bin/glm-agent serve ' "${root3}/etc/systemd/system/glm-agent.service" &&
  [[ -x "${root3}/opt/glm/bin/glm-agent" && ! -e "${root3}/etc/systemd/system/glm-controller.service" &&
    ! -e "${root3}/opt/glm/bin/glm-controller" && ! -e "${root3}/etc/glm/controller.env" ]]; then
  pass "--role agent --prefix /opt/glm: agent only, ExecStart=/opt/glm/bin/glm-agent"
else
  fail "--role agent --prefix /opt/glm: agent only, ExecStart=/opt/glm/bin/glm-agent" \
    "$(grep '^ExecStart' "${root3}/etc/systemd/system/glm-agent.service" 2>&1 || true)"
fi

# expect_error NAME WANT_RC PATTERN ARGS...: install.sh fails with WANT_RC and says PATTERN.
expect_error() {
  local name="$1" want_rc="$2" pattern="$3" rc=0 out
  shift 3
  out="$("${install_sh}" "$@" 2>&1)" || rc=$?
  if ((rc == want_rc)) && grep -qE -- "${pattern}" <<<"${out}"; then pass "${name}"; else
    fail "${name}" "exit ${rc} (want ${want_rc}); output: ${out}"; fi
}
mkdir -p "${scratch}/root4" "${scratch}/empty-build"
expect_error "a --bin-dir without binaries is refused, naming the binary and the fix" 1 \
  'no glm[a-z-]* in .*empty-build; build it' --root "${scratch}/root4" --bin-dir "${scratch}/empty-build"
expect_error "an unknown --role is a usage error" 2 '--role must be controller, agent or both' \
  --root "${scratch}/root4" --bin-dir "${bin_dir}" --role workers
expect_error "--enable with --root is a usage error" 2 '--enable' \
  --root "${scratch}/root4" --bin-dir "${bin_dir}" --enable
if "${install_sh}" --help | grep -q -- '--bin-dir DIR'; then pass "install.sh --help exits 0 and lists the flags"; else
  fail "install.sh --help exits 0 and lists the flags"; fi

echo
if ((failures)); then
  echo "deploy_test: ${failures} check(s) FAILED"
  exit 1
fi
echo "deploy_test: all checks passed"
