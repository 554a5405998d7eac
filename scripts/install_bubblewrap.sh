#!/usr/bin/env sh
# Install bubblewrap (Debian package `bubblewrap`), the code sandbox's preferred containment
# (design/rollart-env.md D7). Never fails the build: without it the sandbox falls back to its
# weaker process mode, and this script says so plainly.
if command -v bwrap >/dev/null 2>&1; then
  echo "sandbox: bubblewrap present ($(bwrap --version 2>/dev/null))"
  exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null 2>&1; then
    echo "sandbox: installed bubblewrap ($(bwrap --version 2>/dev/null))"
    exit 0
  fi
fi
echo "sandbox: WARNING could not install bubblewrap (needs root and apt-get: 'apt-get install bubblewrap');" \
     "the code sandbox will run in its process fallback mode (see docs/security.md)" >&2
exit 0
