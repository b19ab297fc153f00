# Sourced by the setup scripts: apt_install COMMAND PACKAGE succeeds when COMMAND is on
# PATH, or after Debian's PACKAGE is installed (as root with apt-get, updating the package
# lists once if the first try fails); it fails otherwise, saying nothing.
apt_install() {
  local command="$1" package="$2"
  if command -v "$command" >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    return 1
  fi
  echo "setup: installing $package (apt-get)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null 2>&1; }
}
