"""The RPC commands the laptop calls, one exec each: prepare, claim, submit, status, export, git,
seal, import (and pump, the daemon prepare and status start). Payloads arrive on stdin,
never in argv; every command answers with exactly one JSON object on stdout."""

import argparse
import base64
import json
import os
import secrets
import subprocess
import sys
import traceback

from .disk import FileLock, atomic_write, fsync_dir, now_iso, read_json, read_text, sha256_hex, write_json
from .files import (discard, placed, plan_files, read_requested, receive_files, remember_placed, send_requested,
                    sweep_temps, write_files)
from .gitstate import ensure_git_exclude, ensure_repo, inventory, make_bundle
from .opencode import Api, ApiError, find_opencode, opencode_env, opencode_version
from .procs import kill_group, owned_alive, servers_in
from .protocol import (EXIT_CRASH, EXIT_DOMAIN, EXIT_OK, EXIT_USAGE, PROMPT_MAX, Fail, Usage, disk_full, emit,
                       failure, mib, workspace_failure)
from .pump import ensure_pump, recover_session, run_pump, tick
from .server import LISTEN_TIMEOUT, ensure_server
from .state import PROMPT_ID_RE, SESSION_ID_RE, Work, submit_key


def read_stdin():
    return sys.stdin.buffer.read()


def resolve_arg(args):
    return [i for i in (getattr(args, "resolve", None) or "").split(",") if i]


def cmd_prepare(args):
    work = Work(args.work)
    raw = read_stdin()
    password = raw.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", "replace")
    lost = not work.exists() and os.path.isdir(work.tree)  # a tree whose state was removed
    work.create()
    old = read_text(work.p("password"))
    if not password:
        password = old or secrets.token_urlsafe(32)
    changed = old is not None and old != password
    if old != password:
        atomic_write(work.p("password"), password.encode("utf-8"), mode=0o600)
    os.chmod(work.p("password"), 0o600)
    try:
        os.unlink(work.p("sealed"))  # ensure and resume reopen a work a refused drop sealed
    except FileNotFoundError:
        pass
    try:
        repo = ensure_repo(work)
    except Fail as e:  # no git on the image: the work runs, and drop will say GIT_UNKNOWN
        work.log("helper.log", "prepare: the work tree could not be made a repository: %s" % e.message)
        repo = "unavailable"
    binary = find_opencode()
    if not binary:
        raise Fail("GUEST_VERSION", "opencode is not installed on this machine; expected version %s" % args.opencode_version)
    have = opencode_version(binary)
    if args.opencode_version and have != args.opencode_version:
        raise Fail("GUEST_VERSION", "the machine has OpenCode %s but the laptop runs %s" % (have, args.opencode_version),
                   guestVersion=have, laptopVersion=args.opencode_version)
    st_path = work.p("state.json")
    if not os.path.exists(st_path):
        st = work.state()
        st.last_activity_at = now_iso()
        work.save_state(st)
    if lost:
        # What the state that went had admitted is forgotten: the export says so (forgotAt),
        # and the laptop's proof then counts those prompts as ended (tools/harvest.rs). A
        # fork's first prepare is marked too; its ledger record starts with no prompts.
        with work.state_lock(30.0):
            st = work.state()
            if not st.forgot_at:
                st.forgot_at = now_iso()
                work.save_state(st)
        for pid in servers_in(work.tree):
            kill_group(pid)
    if changed:
        info = work.server_info()
        if info and owned_alive(info, work.tree):
            with FileLock(work.p("server.lock"), timeout=LISTEN_TIMEOUT + 30):
                kill_group(info["pid"])
    how, info = ensure_server(work, password, want_version=args.opencode_version)
    out = {"ok": True, "work": work.id, "port": info["port"], "serverStarted": how != "up",
           "opencodeVersion": have, "tree": work.tree, "repo": repo}
    # A tree with no state is also a fork's first prepare (its tree is copied without it):
    # only a root session of this work in OpenCode tells that the state was there and went.
    sid = lost and (work.session_id() or recover_session(work, Api(info["port"], password)))
    if sid:
        work.log("helper.log", "prepare: the work's state was gone; made again (root session %s)" % sid)
        out["stateRecreated"] = {"sessionId": sid, "note": "the helper's state of this work had been removed: prompts "
                                 "that were waiting to start were lost with it and will not run"}
    ensure_pump(work)
    return out


def cmd_claim(args):
    """The laptop took this machine up by its name alone (its create never answered with an
    id): a work here that already runs with another password is another ledger's (another
    install of the plugin on the same account names its machines the same way). Only the
    password's sha256 comes, so a machine that is not ours never sees it; nothing is written."""
    work = Work(args.work)
    old = read_text(work.p("password")) if work.exists() else None
    if old and sha256_hex(old.encode("utf-8")) != args.sha256:
        raise Fail("NOT_OURS", "work %s on this machine was prepared by another ledger (its OpenCode server runs with "
                   "another password): this is not the machine this ledger's create made" % work.id)
    return {"ok": True, "work": work.id, "claimed": True}


def cmd_submit(args):
    # A refusal before the prompt was admitted says so (`"admitted": false`): the laptop
    # then takes back the prompt it recorded, which else waited ten minutes for a word
    # that could not come and held the work's drop meanwhile.
    admitted = []
    try:
        return submit(args, admitted)
    except Fail as f:
        if not admitted:
            f.extra.setdefault("admitted", False)
        raise


def submit(args, admitted):
    work = Work(args.work)
    work.require()
    if work.sealed_recently():
        raise Fail("SESSION_BUSY", "work %s was sealed for a drop moments ago; nothing was written or admitted" % work.id)
    sweep_temps(work)
    # One line of JSON, then the files' frames (frames.py): the line is at most the prompt,
    # each character escaped (\uXXXX), and the file list.
    raw = sys.stdin.buffer.readline(6 * PROMPT_MAX + (1 << 20))
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise Fail("ARGS_INVALID", "submit expects one JSON object on a line of stdin: %s" % e)
    if not isinstance(payload, dict):
        raise Fail("ARGS_INVALID", "submit expects one JSON object on stdin")
    prompt_id, prompt, files = payload.get("promptId"), payload.get("prompt"), payload.get("files") or []
    to_resolve = payload.get("resolve") or []
    if not isinstance(to_resolve, list):
        raise Fail("ARGS_INVALID", "resolve must be a list of prompt ids")
    if not isinstance(prompt_id, str) or not PROMPT_ID_RE.match(prompt_id):
        raise Fail("NAME_INVALID", "promptId %r is not valid: use [A-Za-z0-9._-], at most 80 characters" % (prompt_id,))
    if not isinstance(prompt, str) or not prompt:
        raise Fail("ARGS_INVALID", "prompt must be a non-empty string")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise Fail("ARGS_INVALID", "prompt is not valid Unicode (it holds a lone surrogate)")
    if len(prompt.encode("utf-8")) > PROMPT_MAX:
        raise Fail("FILE_TOO_LARGE", "the prompt is %d bytes; the limit is %s" % (len(prompt.encode("utf-8")), mib(PROMPT_MAX)))
    same_pending = payload.get("samePending") is True
    password = work.password()
    planned, digests = plan_files(work, files), []
    received = receive_files(work, planned, sys.stdin.buffer, digests)
    # The bytes each target may hold and still be replaced: what the laptop sent or brought
    # home there (`held`), what a submit placed there, and what is being sent now.
    given = {"/".join(parts): d for (parts, _), d in zip(planned, digests)}
    keep = {path: set(held_of(f)) | {given[path]} for path, f in zip(given, files)}
    key = submit_key(prompt, [("/".join(parts), d) for (parts, _), d in zip(planned, digests)])
    if same_pending:
        try:  # a run that has just ended is recorded as ended before the check below
            tick(work, lock_timeout=20.0)
        except Exception as e:
            work.log("helper.log", "submit: pump step before admission failed: %s: %s" % (type(e).__name__, e))
    # admit: the duplicate check, the files and the inbox entry are one critical section
    # under the lock the pump dispatches under, so two submits of one id cannot both write
    # files and the pump cannot start this prompt in between; "queued" is decided there too
    duplicate, twin = False, None
    try:
        with work.state_lock(30.0):
            if work.sealed_recently():
                raise Fail("SESSION_BUSY", "work %s was sealed for a drop moments ago; nothing was admitted" % work.id)
            st = work.state()
            entries = work.inbox_entries()
            queued = bool(st.current) or bool(work.waiting(st)) or opencode_busy(work, password)
            if prompt_id in work.admitted(st, entries):
                # A retry of a submit whose answer was lost: its files were placed then, and
                # the agent may have changed them since. Putting them back would undo that work.
                duplicate = True
            elif same_pending and (twin := work.pending_twin(st, entries, key)):
                # The same text and files still waiting or running under another id: a
                # retry whose first call ran on after its client gave up, or the same
                # submit from two places at once. It runs once; a repeat after that run
                # has ended is admitted as a prompt of its own.
                duplicate = True
            else:
                for path, shas in placed(work).items():
                    if path in keep and isinstance(shas, list):
                        keep[path].update(d for d in shas if isinstance(d, str))
                write_files(work, received, keep)
                remember_placed(work, given.items())
                admit(work, st, entries, prompt_id, prompt, key)
            admitted.append(True)
    finally:
        discard(received)  # those not placed (a refusal, a duplicate, a failure part way)
    ensure_git_exclude(work)
    # then start it now when nothing runs (else the pump does, within half a second)
    try:
        ensure_server(work, password)
    except (Fail, TimeoutError) as e:
        work.log("helper.log", "submit: server not available (%s); the prompt waits in the inbox" % (getattr(e, "message", None) or e,))
    ensure_pump(work)
    try:
        tick(work, lock_timeout=20.0)
    except Exception as e:  # the prompt is admitted: the pump will start it
        work.log("helper.log", "submit: start deferred to the pump: %s: %s" % (type(e).__name__, e))
    st = work.state()
    pending = len(work.waiting(st))
    out = {"ok": True, "admitted": True, "queued": queued, "pending": pending, "sessionId": work.session_id(),
           "files": len(files)}
    if duplicate:
        out["duplicate"] = True
    if twin:
        out["duplicateOf"] = twin
    if to_resolve:
        out["resolved"] = work.resolved(to_resolve)
    return out


def held_of(f):
    """A submit file's `held`: the digests the laptop holds of that path (a list of hex)."""
    held = f.get("held") or []
    if not isinstance(held, list) or not all(isinstance(h, str) for h in held):
        raise Fail("ARGS_INVALID", "files[].held must be a list of sha256 digests")
    return held


def admit(work, st, entries, prompt_id, prompt, key=None):
    """Write the prompt's inbox entry durably, then the state that counts it. The entry is
    the admission: a helper killed before the state write leaves it, and the next admission
    numbers past it and counts its id as admitted (Work.admission_seq, Work.admitted).
    `key` (state.submit_key) lets a later identical submit find it while it waits or runs."""
    seq = work.admission_seq(st, entries)
    entry = {"seq": seq, "promptId": prompt_id, "prompt": prompt, "admittedAt": now_iso()}
    if key:
        entry["key"] = key
    path = os.path.join(work.inbox, "%012d-%s.json" % (seq, prompt_id))
    try:
        atomic_write(path, json.dumps(entry, ensure_ascii=True).encode("ascii"))
    except OSError as e:
        raise workspace_failure(e, "admitting prompt %s" % prompt_id)
    st.next_seq = seq + 1
    st.remember(prompt_id)
    st.last_activity_at = now_iso()
    try:
        work.save_state(st)
    except OSError as e:
        # Answered as not admitted, so the entry goes too (if it cannot, it is admitted
        # all the same: it runs, and resolve says so).
        try:
            os.unlink(path)
            fsync_dir(work.inbox)
        except OSError:
            pass
        raise workspace_failure(e, "admitting prompt %s" % prompt_id)


def opencode_busy(work, password):
    """True when OpenCode itself reports the work's session busy (e.g. a prompt sent by hand)."""
    info, sid = work.server_info() or {}, work.session_id()
    if not sid or not info.get("ready") or not owned_alive(info, work.tree):
        return False
    try:
        smap = Api(info["port"], password).get("/session/status", timeout=5)
    except ApiError:
        return False
    return bool(isinstance(smap, dict) and smap.get(sid))


def status_fields(work, st, server, smap=None):
    inbox = work.waiting(st)
    sid = work.session_id()
    entry = smap.get(sid) if (sid and isinstance(smap, dict)) else None
    busy = bool(st.current) or bool(inbox) or bool(entry)
    last = st.last or {}
    out = {
        "state": "busy" if busy else "idle",
        "outcome": last.get("outcome"),
        "lastText": last.get("lastText", ""),
        "lastActivityAt": st.last_activity_at,
        "pending": len(inbox),
        "sessionId": sid,
        "runs": st.runs,
        "server": server,
        "interrupted": bool(last.get("interrupted")),
        "failure": last.get("failure"),
        "promptId": last.get("promptId"),
    }
    if last.get("declined"):
        out["declined"] = last["declined"]
    if st.current:
        out["running"] = {"promptId": st.current.get("promptId"), "startedAt": st.current.get("sentAt")}
        if st.current.get("declined"):
            out["running"]["declined"] = st.current["declined"]
        if st.current.get("retry"):
            r = st.current["retry"]
            out["retry"] = {"attempt": r.get("attempt"), "message": r.get("message"), "next": r.get("next")}
    return out


def ready_work(args):
    """The common start of status and export: the work, its server and pump running, and
    one pump step taken. Returns (work, password, how the server was found, server info)."""
    work = Work(args.work)
    work.require()
    ensure_git_exclude(work)
    password = work.password()
    how, info = ensure_server(work, password)
    ensure_pump(work)
    try:
        tick(work, lock_timeout=10.0)
    except Exception as e:  # report what the state files say; the pump keeps trying
        work.log("helper.log", "%s: pump step failed: %s: %s" % (args.command, type(e).__name__, e))
    return work, password, how, info


def cmd_status(args):
    work, password, how, info = ready_work(args)
    api, smap = Api(info["port"], password), None
    try:
        smap = api.get("/session/status", timeout=10)
    except ApiError:
        pass
    with work.state_lock(30.0):
        st = work.state()
        out = status_fields(work, st, "restarted" if how == "restarted" else "up", smap)
        report_interrupt = st.interrupt_pending
        if report_interrupt:
            st.interrupt_pending = False
            work.save_state(st)
    if out["state"] == "busy":
        try:
            perms = api.get("/permission", timeout=5)
            questions = api.get("/question", timeout=5)
            waiting = {"permissions": len(perms) if isinstance(perms, list) else 0,
                       "questions": len(questions) if isinstance(questions, list) else 0}
            if waiting["permissions"] or waiting["questions"]:
                out["waiting"] = waiting
        except ApiError:
            pass
    if report_interrupt:
        note = (st.last or {}).get("note") or "the OpenCode server stopped"
        raise Fail("RUN_INTERRUPTED", "prompt %s was interrupted: %s; the server was %s" % (
            out.get("promptId"), note, "restarted" if how == "restarted" else "already running again"), **out)
    out["resolved"] = work.resolved(resolve_arg(args))
    if how == "restarted":
        raise Fail("GUEST_SERVER_DOWN", "the OpenCode server was not running; it was restarted on port %d" % info["port"], **out)
    return {"ok": True, **out}


def cmd_export(args):
    work, password, how, info = ready_work(args)
    api = Api(info["port"], password)
    # Which asked-about prompts were admitted is read before the snapshot below, so each
    # one it names is in it: running or waiting (SESSION_BUSY), or its run ended and in the
    # sessions read after. The laptop's proof counts them (tools/harvest.rs, covered).
    resolved = work.resolved(resolve_arg(args))
    sid = work.session_id() or recover_session(work, api)
    st = export_idle(work, api, sid)
    newest = st.newest_prompt
    if not sid:
        return {"ok": True, "sessions": [], "resolved": resolved, "newestPrompt": newest}
    sessions, queue, seen = [], [sid], set()
    while queue:
        cur = queue.pop(0)
        if cur in seen:
            continue
        seen.add(cur)
        try:
            info_s = api.get("/session/%s" % cur, timeout=30)
        except ApiError as e:
            if e.status == 404 and cur == sid:
                raise Fail("GUEST_FAILED", "the work's root session %s is missing from OpenCode" % sid)
            raise Fail("GUEST_FAILED", "cannot read session %s: %s" % (cur, e))
        try:
            messages = api.get("/session/%s/message" % cur, timeout=120)
            children = api.get("/session/%s/children" % cur, timeout=30) or []
        except ApiError as e:
            raise Fail("GUEST_FAILED", "cannot read session %s: %s" % (cur, e))
        sessions.append({"info": info_s, "messages": messages})
        for child in sorted(children, key=lambda c: (((c.get("time") or {}).get("created") or 0), c.get("id", ""))):
            if isinstance(child, dict) and child.get("id"):
                queue.append(child["id"])
    # A run that started while the sessions were read left them half written: the laptop
    # would import that, and its import keeps a message id's first version for ever.
    again = export_idle(work, api, sid)
    if (again.next_seq, again.dispatched_seq, again.runs) != (st.next_seq, st.dispatched_seq, st.runs):
        raise Fail("SESSION_BUSY", "work %s took a prompt while it was exported; export again once its run ends" % work.id)
    out = {"ok": True, "sessions": sessions, "resolved": resolved, "newestPrompt": newest}
    if st.forgot_at:
        out["forgotAt"] = st.forgot_at
    return out


def export_idle(work, api, sid):
    """The state, read under the state lock, when no run is current, no prompt waits and
    OpenCode's session is not busy; else SESSION_BUSY."""
    with work.state_lock(30.0):
        st = work.state()
        pending = work.waiting(st)
    smap = api.get("/session/status", timeout=10) or {}
    if st.current or pending or (sid and smap.get(sid)):
        raise Fail("SESSION_BUSY", "work %s is busy (a run is in flight or %d prompt(s) wait)" % (work.id, len(pending)))
    return st


def cmd_import(args):
    work = Work(args.work)
    raw = read_stdin()
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise Fail("EXPORT_INVALID", "import expects the JSON of export on stdin: %s" % e)
    sessions = payload.get("sessions") if isinstance(payload, dict) else None
    if not isinstance(sessions, list):
        raise Fail("EXPORT_INVALID", "import expects {\"sessions\": [...]} on stdin")
    by_id = {}
    for i, s in enumerate(sessions):
        sid = ((s or {}).get("info") or {}).get("id") if isinstance(s, dict) else None
        if not isinstance(sid, str) or not SESSION_ID_RE.match(sid) or not isinstance(s.get("messages"), list):
            raise Fail("EXPORT_INVALID", "sessions[%d] needs info.id (ses_...) and a messages list" % i)
        if sid in by_id:
            raise Fail("EXPORT_INVALID", "session %s appears twice" % sid)
        by_id[sid] = s
    # parents first, keeping the given order otherwise
    ordered, placed = [], set()

    def place(sid, depth=0):
        if sid in placed or depth > len(by_id):
            return
        parent = by_id[sid]["info"].get("parentID")
        if parent in by_id:
            place(parent, depth + 1)
        placed.add(sid)
        ordered.append(sid)

    for s in sessions:
        place(s["info"]["id"])
    roots = [sid for sid in ordered if by_id[sid]["info"].get("parentID") not in by_id]
    if len(roots) > 1:
        raise Fail("EXPORT_INVALID", "the export holds %d root sessions; expected one tree" % len(roots))
    work.create()
    ensure_git_exclude(work)
    st = work.state()
    if st.current:
        raise Fail("SESSION_BUSY", "work %s has a run in flight; import only into an idle work" % work.id)
    binary = find_opencode()
    if not binary:
        raise Fail("GUEST_VERSION", "opencode is not installed on this machine")
    for sid in ordered:
        s = by_id[sid]
        path = work.p("tmp", "import-%s.json" % sid)
        write_json(path, {"info": s["info"], "messages": s["messages"]}, mode=0o600)
        try:
            r = subprocess.run([binary, "import", path], cwd=work.tree, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300, env=opencode_env())
        except subprocess.TimeoutExpired:
            raise Fail("GUEST_FAILED", "opencode import of %s took longer than 300 s" % sid)
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        if r.returncode != 0:
            raise Fail("GUEST_FAILED", "opencode import of %s failed (exit %d): %s" % (
                sid, r.returncode, (r.stderr or r.stdout).decode("utf-8", "replace")[-600:].strip()))
    if roots:
        work.set_session_id(roots[0])
    return {"ok": True, "imported": len(ordered), "sessionId": roots[0] if roots else work.session_id()}


def cmd_git(args):
    work = Work(args.work)
    if not os.path.isdir(work.tree):
        raise Fail("WORK_UNKNOWN", "work %s has no work tree on this machine (%s)" % (work.id, work.tree))
    requested, have = [], {}
    if args.files_stdin:
        try:
            body = json.loads(read_stdin().decode("utf-8") or "{}")
            extra = body.get("files") or []
            have = body.get("haveRefs") or {}
        except (ValueError, UnicodeDecodeError, AttributeError) as e:
            raise Fail("ARGS_INVALID", "--files-stdin expects {\"files\": [...]} on stdin: %s" % e)
        if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra) or not isinstance(have, dict):
            raise Fail("ARGS_INVALID", "files must be a list of paths, haveRefs an object")
        requested = extra
    files = read_requested(work, requested)
    out, diff = inventory(work)
    out.update({"ok": True, "files": files, "patch": None})
    if diff is not None:
        try:
            out["patch"] = diff.decode("utf-8")
        except UnicodeDecodeError:
            out["patch"] = base64.b64encode(diff).decode("ascii")
            out["patchEncoding"] = "base64"
    if out["refs"]:
        if out["refs"] == have:
            out["bundleUnchanged"] = True
        else:
            out["bundle"] = make_bundle(work)
    # The answer, then the files' frames after it.
    return out, lambda stdout: send_requested(work, files, stdout)


def cmd_seal(args):
    """Before a drop: stop everything that could start or write (the pump, then the
    OpenCode server and its children), then read the tree's live state. Refuses while a
    run is in flight or prompts wait. A later command starts the server and pump again."""
    work = Work(args.work)
    work.require()
    resolved = work.resolved(resolve_arg(args))
    password = work.password()
    with work.state_lock(30.0):
        st = work.state()
        pending = work.waiting(st)
        if st.current or pending or opencode_busy(work, password):
            raise Fail("SESSION_BUSY", "work %s is busy (a run is in flight or %d prompt(s) wait); nothing was stopped" % (work.id, len(pending)))
        pump = read_json(work.p("pump.json")) or {}
        if pump.get("pid") and owned_alive(pump, work.boxd):
            kill_group(pump["pid"], grace=2.0)
        server = work.server_info() or {}
        if server.get("pid") and owned_alive(server, work.tree):
            kill_group(server["pid"])
        try:
            os.unlink(work.p("server.json"))  # stopped on purpose: the next start is not a restart
        except FileNotFoundError:
            pass
        # A submit arriving between this check and the remove is refused for a while:
        # drop checks and removes within seconds; a refused drop's mark goes stale.
        atomic_write(work.p("sealed"), now_iso().encode("ascii"))
        newest = st.newest_prompt
    out, diff = inventory(work)
    out.pop("status", None)
    out.update({"ok": True, "sealed": True, "newestPrompt": newest, "pending": 0, "resolved": resolved,
                "diffSha256": sha256_hex(diff) if diff else None})
    return out


# ---------------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Usage(message)


COMMANDS = {"prepare": cmd_prepare, "claim": cmd_claim, "submit": cmd_submit, "status": cmd_status, "export": cmd_export,
            "git": cmd_git, "seal": cmd_seal, "import": cmd_import}


def main(argv):
    parser = Parser(prog="helper", add_help=False)
    parser.add_argument("command", choices=[*COMMANDS, "pump"])
    parser.add_argument("--work")
    parser.add_argument("--opencode-version")
    parser.add_argument("--files-stdin", action="store_true")
    parser.add_argument("--resolve")
    parser.add_argument("--sha256", default="")
    try:
        args = parser.parse_args(argv)
        if not args.work:
            raise Usage("--work is required")
        if args.command == "pump":
            return run_pump(Work(args.work))
        answer, after = COMMANDS[args.command](args), None
        if isinstance(answer, tuple):
            answer, after = answer
        code = emit(answer, EXIT_OK)
        if after:
            try:
                after(sys.stdout.buffer)
            except Exception:  # the answer is out: end the frames early, loudly
                traceback.print_exc(file=sys.stderr)
                return EXIT_CRASH
        return code
    except Usage as e:
        return emit(failure("ARGS_INVALID", str(e)), EXIT_USAGE)
    except Fail as e:
        return emit(failure(e.kind, e.message, e.extra), EXIT_DOMAIN)
    except (TimeoutError, ApiError) as e:
        return emit(failure("GUEST_FAILED", str(e)), EXIT_DOMAIN)
    except Exception as e:  # a crash: say so on stdout too, so the laptop sees one JSON object
        if disk_full(e):  # not a bug: the guest's disk is full wherever the write was
            f = workspace_failure(e, "writing on the guest")
            return emit(failure(f.kind, f.message), EXIT_DOMAIN)
        traceback.print_exc(file=sys.stderr)
        return emit(failure("GUEST_FAILED", "helper crashed: %s: %s" % (type(e).__name__, e)), EXIT_CRASH)
