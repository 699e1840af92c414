#!/bin/sh
# The laptop's opencode for a conformance step whose host setup names `opencodeFails`: its
# next N runs of `import` or `export` (N is the number in the file `fails` beside it) fail
# as the loser of two opencodes making a fresh database at once does; every other run, and
# every run after those, is the real opencode (`real` beside it). Each run's first word
# goes to `commands`. Each runner lays it out in a folder of its own and checks afterwards
# that `fails` reached 0 and how many imports ran.
here=$(dirname "$0")
echo "$1" >> "$here/commands"
case "$1" in
import | export)
  # One run at a time takes a failure (a lookup runs up to four exports side by side).
  until mkdir "$here/lock" 2> /dev/null; do sleep 0.01; done
  n=$(cat "$here/fails")
  [ "$n" -gt 0 ] && echo $((n - 1)) > "$here/fails"
  rmdir "$here/lock"
  if [ "$n" -gt 0 ]; then
    printf '\033[91m\033[1mError: \033[0mUnexpected error\n\ndatabase is locked\n' >&2
    exit 1
  fi
  ;;
esac
exec "$here/real" "$@"
