#!/bin/sh
# The laptop's opencode for a conformance step whose host setup names `opencodeFails`: its
# next N runs of `import` or `export` (N is the number in the file `fails` beside it) fail
# as the loser of two opencodes making a fresh database at once does; every other run, and
# every run after those, is the real opencode (`real` beside it). Each runner lays it out
# in a folder of its own and checks afterwards that `fails` reached 0.
here=$(dirname "$0")
case "$1" in
import | export)
  n=$(cat "$here/fails")
  if [ "$n" -gt 0 ]; then
    echo $((n - 1)) > "$here/fails"
    printf '\033[91m\033[1mError: \033[0mUnexpected error\n\ndatabase is locked\n' >&2
    exit 1
  fi
  ;;
esac
exec "$here/real" "$@"
