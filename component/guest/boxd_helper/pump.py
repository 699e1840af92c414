"""The pump: one detached process per work that feeds queued prompts to OpenCode one at a
time, follows the run in flight and records how it ended. Commands take one pump step
themselves too (same lock), so their answers are fresh."""

import os
import re
import signal
import subprocess
import sys
import time
import traceback

from .disk import FileLock, fsync_dir, now_iso, read_json, write_json
from .opencode import Api, ApiError
from .procs import identity, kill_group, owned_alive, proc_cmdline
from .protocol import ENTRY
from .state import SESSION_ID_RE

TICK_SECONDS = 0.5
START_GRACE = (60, 30.0)            # (ticks, seconds) idle with no new message before giving up
SETTLE_GRACE = (10, 5.0)            # (ticks, seconds) idle with an unfinished reply before deciding
AUTH_RE = re.compile(
    r"unauthori[sz]ed|invalid[ _-]?(x-)?api[ _-]?key|incorrect api key|api[ _-]?key.{0,40}(invalid|expired|missing|not valid)"
    r"|authentication[ _-]?(failed|error|required)|invalid[ _-]authentication|not authenticated",
    re.IGNORECASE,
)


def ensure_pump(work):
    """Start the detached pump unless one runs with this very helper file."""
    lock = FileLock(work.p("pump.lock"))
    if lock.try_acquire():
        lock.release()
    else:
        info = read_json(work.p("pump.json")) or {}
        if info.get("script") == ENTRY or not owned_alive(info, work.boxd):
            return False
        # a pump of another helper version: replace it
        if "pump" in proc_cmdline(info["pid"]):
            kill_group(info["pid"], grace=2.0)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if lock.try_acquire():
                lock.release()
                break
            time.sleep(0.05)
    log_path = work.p("pump.log")
    if os.path.exists(log_path) and os.path.getsize(log_path) > 2 * 1024 * 1024:
        os.replace(log_path, log_path + ".1")
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen([sys.executable, ENTRY, "pump", "--work", work.id], cwd=work.boxd,
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=dict(os.environ))
    # wait (briefly) until it holds its lock and wrote pump.json, so callers see one pump
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and proc.poll() is None:
        if (read_json(work.p("pump.json")) or {}).get("pid") == proc.pid:
            break
        time.sleep(0.02)
    return True


def run_pump(work):
    work.require()
    lock = FileLock(work.p("pump.lock"))
    if not lock.try_acquire():
        return 0
    write_json(work.p("pump.json"), dict(identity(os.getpid(), work.boxd), script=ENTRY, startedAt=now_iso()))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("%s pump %d started for %s" % (now_iso(), os.getpid(), work.id), flush=True)
    last_error, last_error_at = None, 0.0
    while not stop:
        if not work.exists():
            break
        try:
            tick(work, lock_timeout=5.0)
        except TimeoutError:
            pass
        except Exception:  # the pump must outlive any single failure; log each distinct one once a minute
            text = traceback.format_exc()
            if text != last_error or time.monotonic() - last_error_at > 60:
                print("%s tick failed:\n%s" % (now_iso(), text), flush=True)
                last_error, last_error_at = text, time.monotonic()
        time.sleep(TICK_SECONDS)
    print("%s pump %d stopped" % (now_iso(), os.getpid()), flush=True)
    return 0


def classify(msg):
    """(outcome, failure) from a finished assistant message."""
    info = msg.get("info") or {}
    err = info.get("error")
    if err:
        name = err.get("name") or "Error"
        data = err.get("data") or {}
        message = str(data.get("message") or name)
        if name == "MessageAbortedError":
            return "aborted", None
        status = data.get("statusCode")
        if name == "ProviderAuthError" or status in (401, 403) or AUTH_RE.search(message) or AUTH_RE.search(str(data.get("responseBody") or "")[:2000]):
            return "failed", {"kind": "auth", "message": "%s: %s" % (name, message)}
        return "failed", {"kind": "other", "message": "%s: %s" % (name, message)}
    finish = info.get("finish")
    if finish and finish not in ("tool-calls", "tool_calls"):
        return "completed", None
    return "aborted", None


def newest_text(messages):
    for m in reversed(messages):
        if (m.get("info") or {}).get("role") != "assistant":
            continue
        for part in reversed(m.get("parts") or []):
            if part.get("type") == "text" and isinstance(part.get("text"), str) and part["text"].strip():
                return part["text"]
    return ""


def session_title(work):
    return "boxd work %s" % work.id


def recover_session(work, api):
    """The work's root session when its id went with the helper's state (removed by hand):
    the oldest root session OpenCode holds under the title the helper gave it (OpenCode
    keeps a title it was given). Recorded again, so every earlier run stays exportable
    rather than a new root session hiding them. None when OpenCode has none."""
    try:
        listed = api.get("/session", timeout=30)
    except ApiError:
        return None
    roots = [s for s in listed if isinstance(s, dict) and not s.get("parentID") and s.get("title") == session_title(work)
             and isinstance(s.get("id"), str) and SESSION_ID_RE.match(s["id"])] if isinstance(listed, list) else []
    if not roots:
        return None
    sid = min(roots, key=lambda s: (((s.get("time") or {}).get("created") or 0), s["id"]))["id"]
    work.set_session_id(sid)
    work.log("helper.log", "the session id was missing; found root session %s in OpenCode by its title" % sid)
    return sid


def ensure_session(work, api):
    sid = work.session_id() or recover_session(work, api)
    if sid:
        try:
            api.get("/session/%s" % sid)
            return sid
        except ApiError as e:
            if e.status != 404:
                raise
            work.log("helper.log", "session %s is missing from OpenCode; creating a new root session" % sid)
    created = api.call("POST", "/session", {"title": session_title(work)})[1]
    sid = created["id"]
    work.set_session_id(sid)
    return sid


def tick(work, lock_timeout=10.0):
    """One step of the pump: follow the run in flight, or start the oldest queued prompt."""
    with work.state_lock(lock_timeout):
        st = work.state()
        # drop inbox files that were already sent (a crash between send and unlink); only
        # those this pump recorded as dispatched, never one because of its number alone
        entries = []
        for seq, name in work.inbox_entries():
            if st.dispatched(seq, name):
                try:
                    os.unlink(os.path.join(work.inbox, name))
                except OSError:
                    pass
            else:
                entries.append((seq, name))
        info = work.server_info() or {}
        alive = bool(info.get("ready")) and owned_alive(info, work.tree)
        if st.current:
            follow_run(work, st, info, alive)
        if not st.current and entries and alive:
            dispatch(work, st, info, entries[0])


# What the model is told when the pump rejects an ask on its behalf.
HEADLESS = ("opencode-boxd: this guest runs headless, so nobody can approve this here; "
            "if the agent needs it, allow it in the golden image's OpenCode config")
DECLINED_KEPT = 20                  # the first asks a run declined, kept for status
UNANSWERED = ("(no answer: this guest runs headless and nobody can answer questions here; "
              "choose what you judge best, say which, and go on)")


def decline_asks(api, cur):
    """Permission asks and questions wait for a person, and a headless guest has none: an
    ask is rejected and a question answered with "no answer" (OpenCode tells the model,
    which goes on), so the run can finish and the work can be harvested. What was declined
    is kept on the run for status. True when something was."""
    declined = []
    try:
        for ask in api.get("/permission", timeout=5) or []:
            api.call("POST", "/permission/%s/reply" % ask["id"], {"reply": "reject", "message": HEADLESS}, timeout=5)
            declined.append({"permission": str(ask.get("permission")), "patterns": [str(p) for p in ask.get("patterns") or []][:5]})
        for ask in api.get("/question", timeout=5) or []:
            # Answered in words rather than rejected: a rejected question ends the run.
            answers = [[UNANSWERED] for _ in ask.get("questions") or [{}]]
            try:
                api.call("POST", "/question/%s/reply" % ask["id"], {"answers": answers}, timeout=5)
            except ApiError as e:
                if e.status is None:
                    raise
                api.call("POST", "/question/%s/reject" % ask["id"], timeout=5)
            declined.append({"question": str(((ask.get("questions") or [{}])[0] or {}).get("question", ""))[:200]})
    except (ApiError, KeyError, TypeError, AttributeError):
        pass  # the next tick asks again
    if declined:
        cur["declined"] = ((cur.get("declined") or []) + declined)[:DECLINED_KEPT]
    return bool(declined)


def follow_run(work, st, info, alive):
    cur = st.current
    run_server = cur.get("server") or {}
    run_pid = run_server.get("pid")
    if run_pid and not owned_alive(run_server, work.tree):
        # the server that accepted this prompt is gone: the run cannot finish any more
        work.finish_run(st, "aborted", None, "", interrupted=True,
                   note="the OpenCode server (pid %s) stopped while the run was in flight" % run_pid)
        st.interrupt_pending = True
        work.save_state(st)
        return
    if not alive:
        return
    api = Api(info["port"], work.password())
    sid = cur["sessionId"]
    try:
        smap = api.get("/session/status", timeout=10)
    except ApiError:
        return
    entry = smap.get(sid) if isinstance(smap, dict) else None
    now = time.time()
    if entry:
        retry = entry if entry.get("type") == "retry" else None
        changed = decline_asks(api, cur) or bool(cur.get("idleTicks")) or cur.get("retry") != retry
        cur["idleTicks"], cur["idleSince"], cur["retry"] = 0, None, retry
        try:
            updated = ((api.get("/session/%s" % sid, timeout=10) or {}).get("time") or {}).get("updated")
            if isinstance(updated, (int, float)) and updated / 1000.0 - (cur.get("activity") or 0) >= 5:
                cur["activity"] = updated / 1000.0
                st.last_activity_at = now_iso(updated / 1000.0)
                changed = True
        except ApiError:
            pass
        if changed:
            work.save_state(st)
        return
    try:
        msgs = api.get("/session/%s/message" % sid, timeout=60)
    except ApiError:
        return
    if not isinstance(msgs, list):
        return
    cur["idleTicks"] = cur.get("idleTicks", 0) + 1
    cur["idleSince"] = cur.get("idleSince") or now
    cur["retry"] = None
    idle_ticks, idle_for = cur["idleTicks"], now - cur["idleSince"]
    new = msgs[cur.get("baseCount", 0):]
    if not new:
        if idle_ticks >= START_GRACE[0] and idle_for >= START_GRACE[1]:
            work.finish_run(st, "failed", {"kind": "other", "message": "OpenCode accepted the prompt but never started the run"}, "")
        work.save_state(st)
        return
    last = msgs[-1]
    linfo = last.get("info") or {}
    done = linfo.get("role") == "assistant" and (linfo.get("error") or (
        (linfo.get("time") or {}).get("completed") and linfo.get("finish") not in (None, "tool-calls", "tool_calls")))
    if done or (idle_ticks >= SETTLE_GRACE[0] and idle_for >= SETTLE_GRACE[1]):
        if linfo.get("role") == "assistant":
            outcome, failure = classify(last)
        else:
            outcome, failure = "failed", {"kind": "other", "message": "the run ended without an assistant reply"}
        work.finish_run(st, outcome, failure, newest_text(new))
    work.save_state(st)


def dispatch(work, st, info, entry):
    seq, name = entry
    path = os.path.join(work.inbox, name)
    item = read_json(path)
    if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
        work.log("helper.log", "dropping unreadable inbox entry %s" % name)
        st.mark_dispatched(seq, name)
        work.save_state(st)
        os.unlink(path)
        return
    api = Api(info["port"], work.password())
    try:
        sid = ensure_session(work, api)
        smap = api.get("/session/status", timeout=10)
        if isinstance(smap, dict) and smap.get(sid):
            return  # busy with something we did not send: wait
        base = api.get("/session/%s/message" % sid, timeout=60)
        base_count = len(base) if isinstance(base, list) else 0
        api.call("POST", "/session/%s/prompt_async" % sid, {"parts": [{"type": "text", "text": item["prompt"]}]}, timeout=60)
    except ApiError as e:
        if e.status in (400, 404, 413, 422):
            # OpenCode will never take this prompt: record it as a failed run instead of looping
            st.current = {"seq": seq, "promptId": item.get("promptId"), "sessionId": work.session_id(), "sentAt": now_iso()}
            st.runs += 1
            st.mark_dispatched(seq, name)
            work.finish_run(st, "failed", {"kind": "other", "message": "OpenCode refused the prompt: %s" % e}, "")
            work.save_state(st)
            os.unlink(path)
        else:
            work.log("helper.log", "dispatch of %s deferred: %s" % (name, e))
        return
    ts = time.time()
    st.current = {"seq": seq, "promptId": item.get("promptId"), "sessionId": sid, "sentAt": now_iso(ts),
                     "baseCount": base_count, "idleTicks": 0, "idleSince": None,
                     "server": {k: info.get(k) for k in ("pid", "boot", "start", "cwd")}}
    if isinstance(item.get("key"), str):
        st.current["key"] = item["key"]  # a submit of the same prompt meanwhile is this run's duplicate
    st.runs += 1
    st.mark_dispatched(seq, name)
    st.last_activity_at = now_iso(ts)
    work.save_state(st)
    try:
        os.unlink(path)
        fsync_dir(work.inbox)
    except OSError:
        pass
