#!/usr/bin/env bash
# Installs glm-controller / glm-agent as systemd services on a node (deploy/README.md).
#
#   deploy/install.sh [--role controller|agent|both] [--bin-dir DIR] [--prefix DIR] [--root DIR]
#                     [--enable] [--dry-run]
#
# Puts the binaries in PREFIX/bin (default /usr/local/bin), creates the system user and group
# `glm`, /etc/glm (root:glm 0750) and /var/lib/glm (glm:glm 0750), installs the units into
# /etc/systemd/system and writes /etc/glm/{agent,controller}.env templates when absent (an
# operator's file is never touched). With --root DIR everything goes under DIR (a scratch root or
# an image tree): the user is added by editing DIR/etc/passwd and DIR/etc/group, and systemctl is
# not run. Idempotent: a second run changes nothing and says so. Exit status: 0 done, 1 failed,
# 2 usage error.
set -euo pipefail

readonly kServiceUser=glm
readonly kDefaultPrefix=/usr/local

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_dir="$(dirname "${script_dir}")"

usage() {
  cat <<EOF
usage: deploy/install.sh [options]

  --role controller|agent|both  which daemons this host runs (default: both). Agent nodes:
                                agent; the controller host: controller, or both when it is
                                also a node. glmctl is installed for every role.
  --bin-dir DIR                 the build folder holding glm-agent, glm-controller and glmctl
                                (default: ${repo_dir}/build)
  --prefix DIR                  install prefix; binaries go to DIR/bin (default: ${kDefaultPrefix})
  --root DIR                    install into DIR instead of / (scratch root or image tree);
                                no systemctl calls
  --enable                      systemctl enable --now the role's units (real root only)
  --dry-run                     print what would change; change nothing
  -h, --help                    this text
EOF
}

die() {
  echo "install.sh: error: $*" >&2
  exit 1
}
usage_error() {
  echo "install.sh: $*" >&2
  echo "run 'deploy/install.sh --help' for the options" >&2
  exit 2
}

role=both
bin_dir=""
prefix="${kDefaultPrefix}"
root=""
enable=0
dry_run=0
while (($#)); do
  case "$1" in
    --role)
      (($# >= 2)) || usage_error "--role needs a value: controller, agent or both"
      role="$2"
      shift 2
      ;;
    --role=*) role="${1#*=}"; shift ;;
    --bin-dir)
      (($# >= 2)) || usage_error "--bin-dir needs a directory"
      bin_dir="$2"
      shift 2
      ;;
    --bin-dir=*) bin_dir="${1#*=}"; shift ;;
    --prefix)
      (($# >= 2)) || usage_error "--prefix needs a directory"
      prefix="$2"
      shift 2
      ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --root)
      (($# >= 2)) || usage_error "--root needs a directory"
      root="$2"
      shift 2
      ;;
    --root=*) root="${1#*=}"; shift ;;
    --enable) enable=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage_error "unknown argument '$1'" ;;
  esac
done

case "${role}" in
  controller | agent | both) ;;
  *) usage_error "--role must be controller, agent or both, not '${role}'" ;;
esac
[[ "${prefix}" == /* ]] || usage_error "--prefix must be an absolute path, not '${prefix}'"
prefix="${prefix%/}"
if [[ -n "${root}" ]]; then
  [[ -d "${root}" ]] || die "--root ${root} is not a directory; create it first (mkdir -p ${root})"
  root="$(cd "${root}" && pwd)"
  [[ "${root}" == / ]] && root=""
fi
if ((enable)) && [[ -n "${root}" ]]; then
  usage_error "--enable starts the services on this host, which --root ${root} does not install to; drop one of them"
fi

if [[ -z "${bin_dir}" ]]; then
  bin_dir="${repo_dir}/build"
  [[ -d "${bin_dir}" ]] || die "no build folder at ${bin_dir}; build first (cmake -S . -B build -G Ninja && cmake --build build) or pass --bin-dir DIR"
fi
[[ -d "${bin_dir}" ]] || die "--bin-dir ${bin_dir} is not a directory; pass the build folder holding glm-agent, glm-controller and glmctl"
bin_dir="$(cd "${bin_dir}" && pwd)"

is_root_user=0
[[ "$(id -u)" -eq 0 ]] && is_root_user=1
systemd_running=0
[[ -z "${root}" && -d /run/systemd/system ]] && systemd_running=1
if ((enable)) && ((!systemd_running)); then
  die "--enable: systemd is not running on this host (no /run/systemd/system); drop --enable and start the daemons another way"
fi
if [[ -z "${root}" ]] && ((!is_root_user)) && ((!dry_run)); then
  die "installing into / needs root; run it with sudo, or pass --root DIR (scratch root) or --dry-run"
fi

changes=0
note() { echo "install.sh: $*"; }
# change DESCRIPTION CMD...: runs CMD (or, with --dry-run, only says it would) and counts it.
change() {
  local what="$1"
  shift
  changes=$((changes + 1))
  if ((dry_run)); then
    note "would ${what}"
  else
    note "${what}"
    "$@"
  fi
}

# ---- Service user and group ------------------------------------------------------------------
readonly kNologin=/usr/sbin/nologin

# field_of FILE N: field N of the service user's/group's line in FILE ("" when absent).
field_of() {
  [[ -f "$1" ]] || return 0
  { grep "^${kServiceUser}:" "$1" || true; } | head -n 1 | cut -d: -f"$2"
}
id_taken() { [[ -f "$1" ]] && cut -d: -f3 "$1" | grep -qx "$2"; }
# First free id in 999..100 (the system range, counted down like useradd --system).
free_system_id() {
  local id
  for ((id = 999; id >= 100; id--)); do
    id_taken "$1" "${id}" || { echo "${id}"; return 0; }
  done
  die "no free system id in 100..999 in $1; add the ${kServiceUser} user there by hand"
}
append_line() { printf '%s\n' "$2" >>"$1"; }

# --root: edit ROOT/etc/{passwd,group} (and shadow/gshadow when present); works without root
# and without useradd's chroot.
ensure_user_in_root() {
  local etc="${root}/etc" gid uid
  [[ -d "${etc}" ]] || change "create ${etc}" mkdir -p "${etc}"
  gid="$(field_of "${etc}/group" 3)"
  if [[ -z "${gid}" ]]; then
    gid="$(free_system_id "${etc}/group")"
    change "add group ${kServiceUser} (gid ${gid}) to ${etc}/group" \
      append_line "${etc}/group" "${kServiceUser}:x:${gid}:"
    [[ -f "${etc}/gshadow" ]] && change "add group ${kServiceUser} to ${etc}/gshadow" \
      append_line "${etc}/gshadow" "${kServiceUser}:!::"
  fi
  uid="$(field_of "${etc}/passwd" 3)"
  if [[ -z "${uid}" ]]; then
    uid="${gid}"
    id_taken "${etc}/passwd" "${uid}" && uid="$(free_system_id "${etc}/passwd")"
    change "add user ${kServiceUser} (uid ${uid}) to ${etc}/passwd" \
      append_line "${etc}/passwd" "${kServiceUser}:x:${uid}:${gid}:glmctl daemons:/var/lib/glm:${kNologin}"
    [[ -f "${etc}/shadow" ]] && change "add user ${kServiceUser} to ${etc}/shadow" \
      append_line "${etc}/shadow" "${kServiceUser}:!*:::::::"
  fi
  return 0
}

ensure_user_on_host() {
  command -v useradd >/dev/null || die "useradd not found; install the passwd package (apt-get install passwd)"
  if ! getent group "${kServiceUser}" >/dev/null; then
    change "create system group ${kServiceUser}" groupadd --system "${kServiceUser}"
  fi
  if ! getent passwd "${kServiceUser}" >/dev/null; then
    change "create system user ${kServiceUser} (home /var/lib/glm, no login shell)" \
      useradd --system --gid "${kServiceUser}" --home-dir /var/lib/glm --no-create-home \
      --shell "${kNologin}" --comment "glmctl daemons" "${kServiceUser}"
  fi
  return 0
}

if [[ -n "${root}" ]]; then
  ensure_user_in_root
else
  ensure_user_on_host
fi

# Numeric ids of the service user in the target root ("" in a dry run that has not added it).
svc_uid="$(field_of "${root}/etc/passwd" 3)"
svc_gid="$(field_of "${root}/etc/group" 3)"
can_chown="${is_root_user}"
if ((!is_root_user)); then
  note "not running as root: modes are set, owners are not (deploy/README.md lists them)"
fi

# ---- Files, directories, modes ---------------------------------------------------------------
# want_owner OWNER: "uid:gid" for "root", "root:glm" or "glm:glm"; "" when it cannot be set.
want_owner() {
  ((can_chown)) && [[ -n "${svc_uid}" && -n "${svc_gid}" ]] || return 0
  case "$1" in
    root) echo "0:0" ;;
    root:glm) echo "0:${svc_gid}" ;;
    glm:glm) echo "${svc_uid}:${svc_gid}" ;;
    *) die "internal: unknown owner $1" ;;
  esac
}

# ensure_attrs PATH MODE OWNER: fixes the mode and (as root) the owner of an existing PATH.
ensure_attrs() {
  local path="$1" mode="$2" owner want have
  owner="$3"
  [[ -e "${path}" ]] || return 0  # not created: a dry run
  have="$(stat -c '%a' "${path}")"
  if [[ "${have}" != "${mode#0}" ]]; then
    change "chmod ${mode} ${path} (was ${have})" chmod "${mode}" "${path}"
  fi
  want="$(want_owner "${owner}")"
  [[ -n "${want}" ]] || return 0
  have="$(stat -c '%u:%g' "${path}")"
  if [[ "${have}" != "${want}" ]]; then
    change "chown ${owner} ${path} (was ${have})" chown "${want}" "${path}"
  fi
}

ensure_dir() {
  local path="${root}$1" mode="$2" owner="$3"
  if [[ ! -d "${path}" ]]; then
    [[ -e "${path}" ]] && die "${path} exists and is not a directory; move it away and re-run"
    change "create ${path}" mkdir -p -m "${mode}" "${path}"
  fi
  ensure_attrs "${path}" "${mode}" "${owner}"
}

# put_file SRC DEST MODE OWNER: copies through a temporary file and renames, so a running binary
# is replaced, not overwritten in place.
put_file() {
  local src="$1" dest="$2" mode="$3" owner="$4" tmp want
  tmp="$(dirname "${dest}")/.$(basename "${dest}").install.$$"
  install -m "${mode}" "${src}" "${tmp}"
  want="$(want_owner "${owner}")"
  [[ -z "${want}" ]] || chown "${want}" "${tmp}"
  mv -f "${tmp}" "${dest}"
}

# ensure_file SRC DEST MODE OWNER [keep]: DEST gets SRC's content unless it has it already; with
# "keep" an existing DEST is left as it is (operator configuration). Sets file_changed.
file_changed=0
ensure_file() {
  local src="$1" dest="${root}$2" mode="$3" owner="$4" keep="${5:-}"
  file_changed=0
  if [[ -e "${dest}" && ( "${keep}" == keep ) ]]; then
    note "keeping ${dest} (exists; never overwritten)"
  elif [[ -e "${dest}" ]] && cmp -s "${src}" "${dest}"; then
    :
  else
    local verb=install
    [[ -e "${dest}" ]] && verb=update
    change "${verb} ${dest}" put_file "${src}" "${dest}" "${mode}" "${owner}"
    file_changed=1
    return 0
  fi
  ensure_attrs "${dest}" "${mode}" "${owner}"
}

work_dir="$(mktemp -d)"
trap 'rm -rf "${work_dir}"' EXIT

# Binaries: glmctl always; the daemons of the role; glm-agent-preflight (the `glm-agent
# preflight` subcommand as its own binary) with the agent when the build has it.
binaries=(glmctl)
[[ "${role}" == controller || "${role}" == both ]] && binaries+=(glm-controller)
[[ "${role}" == agent || "${role}" == both ]] && binaries+=(glm-agent glm-agent-preflight)

find_binary() {
  local name="$1" candidate
  for candidate in "${bin_dir}/${name}" "${bin_dir}/agent/preflight/${name}"; do
    if [[ -f "${candidate}" && -x "${candidate}" ]]; then
      echo "${candidate}"
      return 0
    fi
  done
  return 1
}

sources=()
for name in "${binaries[@]}"; do
  if src="$(find_binary "${name}")"; then
    sources+=("${src}")
  elif [[ "${name}" == glm-agent-preflight ]]; then
    note "no glm-agent-preflight in ${bin_dir}; skipped (glm-agent preflight does the same)"
  else
    die "no ${name} in ${bin_dir}; build it (cmake --build ${bin_dir} --target ${name}) or pass --bin-dir with the build folder that has it"
  fi
done

# System directories are created when missing and otherwise left as they are.
ensure_system_dir() {
  [[ -d "${root}$1" ]] || change "create ${root}$1" mkdir -p -m 0755 "${root}$1"
}
ensure_system_dir "${prefix}/bin"
binaries_changed=0
for src in "${sources[@]}"; do
  ensure_file "${src}" "${prefix}/bin/$(basename "${src}")" 0755 root
  ((file_changed)) && binaries_changed=1
done

ensure_dir /etc/glm 0750 root:glm
ensure_dir /var/lib/glm 0750 glm:glm

# Units: the repository's files with ExecStart pointing at PREFIX/bin.
ensure_system_dir /etc/systemd/system
units=()
[[ "${role}" == controller || "${role}" == both ]] && units+=(glm-controller.service)
[[ "${role}" == agent || "${role}" == both ]] && units+=(glm-agent.service)
units_changed=0
for unit in "${units[@]}"; do
  sed "s#/usr/local/bin/#${prefix}/bin/#g" "${script_dir}/systemd/${unit}" >"${work_dir}/${unit}"
  ensure_file "${work_dir}/${unit}" "/etc/systemd/system/${unit}" 0644 root
  ((file_changed)) && units_changed=1
done

# Environment templates: written once, then the operator's.
cat >"${work_dir}/agent.env" <<'EOF'
# glm-agent flags for glm-agent.service (`glm-agent serve --help` lists them all). This file is
# the operator's: deploy/install.sh writes it once and never overwrites it.
#   --listen   the address cluster.yaml's nodes[].agent names for this node (port 47101 in the
#              example configs); 0.0.0.0:PORT listens on every interface
#   --node     this node's nodes[].name in cluster.yaml
#   --fabric-ip  nodes[].fabric_ip: serves the path-MTU echo (mtu.path checks) and the staging
#              port there; the agent waits for nothing, so the IP must be up when it starts
#   --tls-ca/--tls-cert/--tls-key  when cluster.yaml sets controller.tls (`glmctl certs`);
#              keep the files in /etc/glm/tls, group glm, mode 0640
#   --model-dir / --nccl-library  when this node keeps the model / NCCL elsewhere than
#              cluster.yaml's model.path / nccl.library (the unit must be able to write there:
#              see ReadWritePaths in deploy/README.md)
# Uncomment and edit; `systemctl restart glm-agent` applies it.
#GLM_AGENT_ARGS="--listen 0.0.0.0:47101 --node spark-1 --fabric-ip 192.168.200.1 --tls-ca /etc/glm/tls/ca.pem --tls-cert /etc/glm/tls/spark-1.pem --tls-key /etc/glm/tls/spark-1.key"
EOF
cat >"${work_dir}/controller.env" <<'EOF'
# Extra glm-controller flags for glm-controller.service (`glm-controller --help`). The unit
# already passes --config /etc/glm/cluster.yaml --state-dir /var/lib/glm/controller. This file
# is the operator's: deploy/install.sh writes it once and never overwrites it.
#   --log-level debug|info|warn|error
#   --listen ADDR      instead of controller.listen from cluster.yaml
#   --heartbeat-ms N   agent status heartbeat interval
GLM_CONTROLLER_ARGS=""
EOF
[[ "${role}" == agent || "${role}" == both ]] &&
  ensure_file "${work_dir}/agent.env" /etc/glm/agent.env 0640 root:glm keep
[[ "${role}" == controller || "${role}" == both ]] &&
  ensure_file "${work_dir}/controller.env" /etc/glm/controller.env 0640 root:glm keep

# ---- systemd -----------------------------------------------------------------------------------
if ((units_changed)) && [[ -z "${root}" ]]; then
  if ((systemd_running)); then
    change "systemctl daemon-reload" systemctl daemon-reload
  else
    note "systemd is not running on this host: no daemon-reload (the units take effect when it starts)"
  fi
fi
if ((binaries_changed)) && ((systemd_running)) && ((!dry_run)); then
  for unit in "${units[@]}"; do
    if systemctl is-active --quiet "${unit}"; then
      note "${unit} still runs the previous binary; restart it (one node at a time:" \
        "glmctl restart --rolling /etc/glm/cluster.yaml --processes, or systemctl restart ${unit})"
    fi
  done
fi

if ((enable)); then
  for unit in "${units[@]}"; do
    if [[ "${unit}" == glm-agent.service ]] &&
      ! grep -Eq '^[[:space:]]*GLM_AGENT_ARGS=.*--node' /etc/glm/agent.env; then
      die "--enable: /etc/glm/agent.env sets no GLM_AGENT_ARGS with --listen and --node; edit it (the template shows an example), then re-run"
    fi
    if [[ "${unit}" == glm-controller.service && ! -f /etc/glm/cluster.yaml ]]; then
      die "--enable: no /etc/glm/cluster.yaml; copy your cluster file there (group glm, mode 0640), then re-run"
    fi
    if systemctl is-enabled --quiet "${unit}" && systemctl is-active --quiet "${unit}"; then
      continue
    fi
    change "systemctl enable --now ${unit}" systemctl enable --now "${unit}"
  done
fi

if ((changes == 0)); then
  note "nothing changed: everything is installed${root:+ under ${root}}"
elif ((dry_run)); then
  note "dry run: ${changes} change(s) listed above; nothing was changed"
else
  note "done: ${changes} change(s)${root:+ under ${root}}"
fi
