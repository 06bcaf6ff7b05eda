"""The simulator drives the daemons' decision code; it holds no placement loop of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import laminar_sim

#: Names only a placement loop or a queue walk touches: probe rounds and late binding belong
#: to laminar_zone.gather.Gather, blocked heads and EASY backfill to
#: laminar_zone.queue.QueueWalk (stepped only by laminar_zone.queue.class_order, the one
#: pass that strings rigid walks and clearing rounds together in class order), a clearing
#: round to laminar_zone.market.clearing_round; the router and every simulator drive those.
PLACEMENT_LOOP_NAMES = frozenset(
    {
        "choose_offers",
        "assign_gang",
        "best_offers",
        "next_batch",
        "may_backfill",
        "round_bids",
        "may_try",
    }
)


def names_used(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add(node.name.rsplit(".", 1)[-1])
    return found


def test_no_simulator_module_strings_probes_and_late_binding_together() -> None:
    package = Path(laminar_sim.__file__).parent
    offenders = {
        str(path.relative_to(package)): sorted(names_used(path) & PLACEMENT_LOOP_NAMES)
        for path in sorted(package.rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert len(offenders) > 5  # the scan read the package


def test_the_scan_sees_a_loop_when_there_is_one(tmp_path: Path) -> None:
    sample = tmp_path / "loop.py"
    sample.write_text(
        "def f(plan, offers):\n    while plan.next_batch():\n        choose_offers(offers, 1)\n"
    )
    assert names_used(sample) & PLACEMENT_LOOP_NAMES == {"next_batch", "choose_offers"}


#: What only the agent's decision core may ask of its ledger: a simulated host goes through
#: AgentCore (arbitrate, commit, release, end), as the agent's Node does.
LEDGER_DECISIONS = frozenset({"arbitrate", "commit", "release", "expire"})


def ledger_decisions(path: Path) -> list[str]:
    """``x.ledger.arbitrate(...)``-style calls in a module: a decision taken around the core."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in LEDGER_DECISIONS
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "ledger"
        ):
            found.append(f"{path.name}:{node.lineno}: .ledger.{node.attr}")
    return found


def test_no_simulator_module_settles_probes_around_the_agents_core() -> None:
    package = Path(laminar_sim.__file__).parent
    assert [f for p in sorted(package.rglob("*.py")) for f in ledger_decisions(p)] == []


def test_the_ledger_scan_sees_a_direct_call(tmp_path: Path) -> None:
    sample = tmp_path / "direct.py"
    sample.write_text("def f(host, orders):\n    return host.ledger.arbitrate(orders, 0.0)\n")
    assert ledger_decisions(sample) == ["direct.py:2: .ledger.arbitrate"]


def calls(path: Path) -> set[str]:
    """Names a module calls (``f(...)`` or ``x.f(...)``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                found.add(func.id)
            elif isinstance(func, ast.Attribute):
                found.add(func.attr)
    return found


def test_the_router_and_the_atomized_replay_drive_one_class_order() -> None:
    """Rigid walks and clearing rounds are strung together in class order once, in
    laminar_zone.queue.class_order: the router's pass (laminar_zone.trying.pass_steps,
    driven by the router's queue_loop.py, and by sim replay's CoreDriver for MigReplay too)
    drives it, and none steps a queue walk itself (QueueWalk.may_try)."""
    root = Path(laminar_sim.__file__).parents[1]
    router = root / "laminar_zone" / "queue_loop.py"
    steps = root / "laminar_zone" / "trying.py"
    market = root / "laminar_zone" / "atomizer.py"
    replay = root / "laminar_sim" / "atomized.py"
    assert "pass_steps" in calls(router) and "class_order" not in calls(router)
    assert "class_order" in calls(steps)
    assert not {"class_order", "drive"} & calls(replay)
    for path in (router, steps, market, replay):
        assert "may_try" not in calls(path), path
    assert "open_round" in calls(router) and "clear_class" in calls(router)


def test_the_router_and_the_atomized_replay_drive_one_clearing_round() -> None:
    """What a class's round decides (its slices, who bids, the clearing, quota admission,
    starts, extensions, stops) is laminar_zone.round.ClearingRound's: the atomizer and
    MigReplay each build one per pass and carry out its decisions; neither clears bids
    (clearing_round, clear) nor prices them (round_bids, best_bid) itself."""
    root = Path(laminar_sim.__file__).parents[1]
    market = root / "laminar_zone" / "atomizer.py"
    replay = root / "laminar_sim" / "atomized.py"
    for path in (market, replay):
        used = calls(path)
        assert "ClearingRound" in used, path
        assert not used & {"clearing_round", "round_bids", "best_bid"}, path
    assert "clearing_round" in calls(root / "laminar_zone" / "round.py")


#: What only laminar_zone.market.class_windows may do: build the windows a class's round
#: offers (``MarketWindow(...)``) and cut them at a blocked head (``offer_seconds``).
WINDOW_BUILDERS = frozenset({"MarketWindow", "offer_seconds"})


def test_the_router_and_the_atomized_replay_build_windows_with_one_function() -> None:
    """Which slices a class's round offers, for how long (the class's blocked heads, the
    max window), which a piece holds and which were taken this pass: decided once, in
    laminar_zone.market.class_windows, that the round machine both drive calls (and the
    router's announcement to clients); neither builds a MarketWindow or cuts one at a head
    itself."""
    root = Path(laminar_sim.__file__).parents[1]
    market = root / "laminar_zone" / "atomizer.py"
    assert "class_windows" in calls(root / "laminar_zone" / "round.py")
    package = Path(laminar_sim.__file__).parent
    builders = {
        str(path.relative_to(root)): sorted(calls(path) & WINDOW_BUILDERS)
        for path in [market, *sorted(package.rglob("*.py"))]
    }
    assert {k: v for k, v in builders.items() if v} == {}


def test_the_window_scan_sees_a_window_built_by_hand(tmp_path: Path) -> None:
    sample = tmp_path / "windows.py"
    sample.write_text(
        "def f(free, now, cap):\n"
        "    return [m.MarketWindow(*k, 1, 1, offer_seconds(now, 0.0, cap, None)) for k in free]\n"
    )
    assert calls(sample) & WINDOW_BUILDERS == {"MarketWindow", "offer_seconds"}


#: The core's own steps of a try or a pass, and a queue walk: what a driver that strung a
#: try or a pass together itself would call (laminar_zone.trying strings them once).
CORE_STEPS = frozenset(
    {
        "class_order",
        "walk_queue",
        "QueueWalk",
        "order_key",
        "begin_pass",
        "end_pass",
        "old_copy",
        "plan_try",
        "gathered",
        "begin_commit",
        "committed",
        "commit_lost",
        "probe_intent",
        "probe_committed",
        "placed",
        "enqueue",
        "behind_blocked_head",
    }
)


def test_the_router_and_sim_replay_drive_one_try_and_one_pass() -> None:
    """A placement try and a queue pass are strung together once, in laminar_zone.trying:
    the router (try_driver.py and queue_loop.py, the drivers ZoneState wires) and ``sim
    replay`` (replay.py) drive place_try and pass_steps, and neither walks a queue or
    strings the core's try steps itself."""
    root = Path(laminar_sim.__file__).parents[1]
    zone = root / "laminar_zone"
    router = calls(zone / "try_driver.py") | calls(zone / "queue_loop.py")
    replay = calls(root / "laminar_sim" / "replay.py")
    for name, used in (("router", router), ("replay", replay)):
        assert {"place_try", "pass_steps"} <= used, name
        assert not used & CORE_STEPS, (name, used & CORE_STEPS)
    for path in zone.glob("*.py"):  # no other router module strings a try or a pass
        if path.name not in {"try_driver.py", "queue_loop.py", "trying.py"}:
            assert not {"place_try", "pass_steps"} & calls(path), path


#: What stringing a pass or a try together by hand would call, for a simulator that also
#: may not gather or judge an end itself: the core's steps, a walk's order and its head
#: estimate, a gather of one's own, a member's end judged outside the core.
OWN_PASS_OR_TRY = CORE_STEPS | {
    "drive",
    "QueueItem",
    "expected_start",
    "Gather",
    "FixedPlan",
    "ProbePlan",
    "settle",
    "judge_attempt",
    "judge_report",
}


def test_the_atomized_replay_drives_the_routers_pass_and_try_through_one_driver() -> None:
    """MigReplay's rigid jobs are the router's core's entries and its passes and tries are
    the core's (laminar_zone.trying's pass_steps and place_try), driven by the one driver
    sim replay shares (laminar_sim.replay.CoreDriver, which LaminarReplay uses too): it
    submits through it, reports its members' ends through it, and strings none of the
    steps of a pass or a try itself, nor judges an end."""
    root = Path(laminar_sim.__file__).parents[1]
    atomized = root / "laminar_sim" / "atomized.py"
    replay = root / "laminar_sim" / "replay.py"
    used = calls(atomized)
    assert {"CoreDriver", "submit", "end_subjob"} <= used
    assert not used & OWN_PASS_OR_TRY, sorted(used & OWN_PASS_OR_TRY)
    assert {"pass_steps", "place_try", "gather_at_once", "submit", "end_on", "report_end"} <= calls(
        replay
    )
    # One driver: LaminarReplay builds the same CoreDriver, and no class of replay.py but
    # CoreDriver drives pass_steps or place_try.
    tree = ast.parse(replay.read_text())
    drivers = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and {"pass_steps", "place_try"}
        & {
            n.func.id
            for n in ast.walk(node)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
    }
    assert drivers == {"CoreDriver"}
    laminar_replay = next(
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "LaminarReplay"
    )
    assert "CoreDriver" in {
        n.func.id
        for n in ast.walk(laminar_replay)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }


def test_the_pass_scan_sees_a_walk_strung_by_hand(tmp_path: Path) -> None:
    sample = tmp_path / "walk.py"
    sample.write_text(
        "def f(jobs, start, clear):\n"
        "    jobs.sort(key=lambda j: order_key(j, {}, {}))\n"
        "    return drive(class_order(QueueWalk(0.0), jobs, id, est), start, clear)\n"
    )
    assert calls(sample) & OWN_PASS_OR_TRY == {"order_key", "drive", "class_order", "QueueWalk"}


def test_sim_fgd_drives_the_routers_try_and_pass() -> None:
    """``sim fgd``'s routers (LaminarCluster, laminar.py) place each pod through their
    core's place_try and run its pass_steps on a queue wake; neither they nor the glue they
    share with sim replay (zone_driver.py) string the core's try steps or walk a queue. The
    router's gather (Gather) is driven in one place only, zone_driver.gather_at_once, the
    answer to GatherLeases."""
    package = Path(laminar_sim.__file__).parent
    laminar = package / "laminar.py"
    glue = package / "zone_driver.py"
    replay = package / "replay.py"
    assert {"place_try", "pass_steps", "drive", "gather_at_once"} <= calls(laminar)
    assert {"gather_at_once", "commit_at_once", "drive"} <= calls(replay)
    for path in (laminar, glue, replay):
        assert not calls(path) & CORE_STEPS, (path, calls(path) & CORE_STEPS)
    assert "Gather" not in names_used(laminar) | names_used(replay)
    assert "GatherMachine" in calls(glue)


def test_sim_load_drives_the_routers_try_and_pass_over_the_network() -> None:
    """``sim load``'s routers (LaminarRun, load.py) submit each task to their zone's core,
    resume its place_try and pass_steps when a reply arrives in simulated time, and string
    none of the core's steps or a queue of their own (no per-shape queues, chains or
    blocked sets: the core's route and pass decide who waits)."""
    load = Path(laminar_sim.__file__).parent / "load.py"
    used = calls(load)
    assert {"place_try", "pass_steps", "submit", "cancel", "end_on", "report_end"} <= used
    assert {"GatherBook", "arbitrate_on", "commit_on", "confirm_on", "CoreHands"} <= used
    assert not used & CORE_STEPS, used & CORE_STEPS
    assert not names_used(load) & {"chains", "queues", "_next_in_chain", "_tick_later"}


#: The life cycle of an atomized job's pieces (laminar_zone.atoms.AtomState and
#: market_work): how a job bids, what a won bid starts, when a held piece is decided and
#: its window ends, what an ended piece means for its job, and the market's work list.
PIECE_LIFE_CYCLE = frozenset(
    {"of", "bidder", "piece", "decide_at", "window_end_at", "piece_ended", "next_state"}
    | {"market_work"}
)
#: What only the life cycle may do: calibrate (a Calibrator's observe, overran, believed),
#: build a bidder (make_bidder, assured_progress), price a job's work left, or name a
#: waiting job in the pass's market work (Bidding).
PIECE_DECISIONS = frozenset(
    {"Calibrator", "overran", "believed", "make_bidder", "assured_progress"}
    | {"work_left_seconds", "Bidding"}
)


def test_the_router_and_the_atomized_replay_drive_one_piece_life_cycle() -> None:
    """The router's Atomizer and MigReplay each hold a laminar_zone.atoms.AtomState per
    atomized job and call its steps; neither calibrates, builds a bidder or weighs an ended
    piece itself (MigReplay once set the job's state and counted violations by hand)."""
    root = Path(laminar_sim.__file__).parents[1]
    market = root / "laminar_zone" / "atomizer.py"
    replay = root / "laminar_sim" / "atomized.py"
    for path in (market, replay):
        used = calls(path)
        assert used >= PIECE_LIFE_CYCLE, (path, sorted(PIECE_LIFE_CYCLE - used))
        assert not used & PIECE_DECISIONS, (path, sorted(used & PIECE_DECISIONS))
    # A finished piece's figures reach the calibrator through piece_ended only (the
    # router's metrics also "observe", so this is the simulator's side alone).
    assert "observe" not in calls(replay)
    assert PIECE_DECISIONS & calls(root / "laminar_zone" / "atoms.py")


def sim_modules_but_the_glue() -> list[Path]:
    """Every module of laminar_sim but zone_driver.py, the glue they share."""
    package = Path(laminar_sim.__file__).parent
    paths = [p for p in sorted(package.rglob("*.py")) if p.name != "zone_driver.py"]
    assert len(paths) > 5  # the scan reads the package
    return paths


def core_calls(path: Path) -> set[str]:
    """Names a module calls on a zone core: ``core.f(...)`` or ``x.core.f(...)``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (isinstance(owner, ast.Name) and owner.id == "core") or (
                isinstance(owner, ast.Attribute) and owner.attr == "core"
            ):
                found.add(node.func.attr)
    return found


#: The core's events a simulated router feeds when a job is submitted (a record, admitted,
#: routed, kicked) and when an agent reports a subjob's end (judged, then the job
#: evaluated): fed once, in zone_driver.submit and report_end.
SUBMIT_REPORT = frozenset({"new_entries", "admit", "route", "kick", "report", "evaluate"})
#: What an agent's answers about commits of unknown outcome mean, strung once for the
#: router and every simulator: laminar_zone.trying.confirm_steps.
CONFIRM = frozenset({"to_confirm", "is_unsure", "confirmed", "reconfirm"})
SUBMIT_REPORT_CONFIRM = SUBMIT_REPORT | CONFIRM


def test_only_the_glue_submits_reports_ends_and_confirms_commits() -> None:
    """``sim fgd``, ``sim load`` and ``sim replay`` submit a job, report a subjob's end
    and ask about an unsure commit through zone_driver's submit, report_end and
    confirm_on; no other module feeds those events to a core itself."""
    offenders = {
        p.name: sorted(core_calls(p) & SUBMIT_REPORT_CONFIRM) for p in sim_modules_but_the_glue()
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    glue = Path(laminar_sim.__file__).parent / "zone_driver.py"
    assert core_calls(glue) >= SUBMIT_REPORT
    # Confirming commits: the router's own steps, driven by the daemon and the glue alike.
    root = Path(laminar_sim.__file__).parents[1]
    reports = root / "laminar_zone" / "reports.py"
    assert not (core_calls(glue) | core_calls(reports)) & CONFIRM
    assert "confirm_steps" in calls(glue) and "confirm_steps" in calls(reports)
    assert core_calls(root / "laminar_zone" / "trying.py") >= CONFIRM


def test_the_core_call_scan_sees_a_submit_by_hand(tmp_path: Path) -> None:
    sample = tmp_path / "submit.py"
    sample.write_text(
        "def f(zone, self, spec, entry):\n"
        "    (e,) = zone.core.new_entries(spec, None, None, 0, 0)\n"
        "    core = zone.core\n"
        "    self.carry_out(core.route(e, False, 0))\n"
        "    self.report(entry)\n"
    )
    assert core_calls(sample) == {"new_entries", "route"}


#: What only the agents' side of the glue builds: a subjob as an agent reports it (a
#: commit's reply, a GetSubjob, an end with its slices, run time and peak), in
#: zone_driver.running_report and end_on.
AGENT_REPORTS = frozenset({"Subjob", "SubjobSpec"})
#: The core's instructions every simulated router carries out alike, in
#: zone_driver.CoreHands (a journal that forgets ended jobs, what is not simulated, and
#: the simulator's own hands for a try, a stop, a release, a wake, a confirm).
COMMON_INSTRUCTIONS = frozenset(
    {"Journal", "Publish", "Count", "Forget", "Place", "Terminate", "Confirm", "Wake"}
)
#: The router's gather as one simulator would set it up or read its probes' replies by
#: itself: zone_driver.GatherBook does, for answers at once and over sim load's network.
GATHER_BOOKS = frozenset(
    {"Gather", "GatherMachine", "CommitOnProbe", "gathered_of", "probe_orders", "Offer"}
)


def test_only_the_glue_builds_agent_reports_and_carries_out_the_cores_instructions() -> None:
    """The end report a simulated agent sends (what the daemon's agent sends: slices,
    start, end, run time, exit code, peak GPU memory), the instructions every router
    carries out alike, and a gather's set-up and reply reading are written once, in
    zone_driver.py: no other simulator module builds a Subjob, names one of those
    instructions or sets up a gather of its own."""
    offenders = {
        p.name: sorted(
            (calls(p) & AGENT_REPORTS) | (names_used(p) & (COMMON_INSTRUCTIONS | GATHER_BOOKS))
        )
        for p in sim_modules_but_the_glue()
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    package = Path(laminar_sim.__file__).parent
    for name in ("laminar.py", "load.py", "replay.py"):
        assert "CoreHands" in calls(package / name), name
    for name in ("load.py", "replay.py"):
        assert "end_on" in calls(package / name), name


def test_the_instruction_scan_sees_a_journal_carried_out_by_hand(tmp_path: Path) -> None:
    sample = tmp_path / "hands.py"
    sample.write_text(
        "from laminar_zone.core import Journal\n"
        "def f(core, instructions):\n"
        "    for i in instructions:\n"
        "        if isinstance(i, Journal):\n"
        "            return common_pb2.Subjob(state=3)\n"
    )
    assert names_used(sample) & COMMON_INSTRUCTIONS == {"Journal"}
    assert calls(sample) & AGENT_REPORTS == {"Subjob"}


#: Flow splitting as a caller would string it itself: laminar_zone.flow.split_flow does.
FLOW_STEPS = frozenset({"split_weights", "choose_weighted", "flow_weight"})


def test_the_router_and_the_simulators_split_flow_with_one_decision() -> None:
    """Which zone takes a fresh job (stale summaries weigh 0, W_z, the draw) is
    laminar_zone.flow.split_flow: the router's PeerRouter (which keeps the summaries and
    sends the forward) and the simulators' routers (sim fgd, and sim load through
    LaminarCluster.route) call it; none weighs or draws itself."""
    root = Path(laminar_sim.__file__).parents[1]
    peers = root / "laminar_zone" / "peers.py"
    for path in (peers, *sim_modules_but_the_glue()):
        assert not calls(path) & FLOW_STEPS, path
    assert "split_flow" in calls(peers)
    assert "split_flow" in calls(root / "laminar_sim" / "laminar.py")
    assert "route" in calls(root / "laminar_sim" / "load.py")  # LaminarCluster.route


def callers_of(path: Path, name: str) -> set[str]:
    """The functions of a module that call ``name`` (``f(...)`` or ``x.f(...)``)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if called == name:
                    found.add(function.name)
    return found


#: The old rule of sim airlock (the GPU with the most room, at or below the target, every
#: fixed delay): the names it was written with.
AIRLOCK_OWN_PLACEMENT = frozenset({"_held_bytes", "_may_take", "_router_tick", "_move"})


def test_sim_airlock_starts_a_run_only_where_the_cores_placed_it() -> None:
    """A re-run or a moved copy starts on a GPU only in ``subjob_started``, the callback an
    agent core's commit triggers (CoreDriver.start_subjob) for a placement the router's core
    made: sim airlock drives the router's core (sim replay's CoreDriver; readdress_at_once for Airlock's
    moves; recover_running for the groups running at the start) and picks no GPU itself."""
    path = Path(laminar_sim.__file__).parent / "airlock_sim.py"
    assert callers_of(path, "_place") == {"subjob_started"}
    assert {"readdress_at_once", "recover_running"} <= calls(path)
    assert "gather_at_once" not in calls(path)  # a move's gather is CoreDriver.gather too
    assert "CoreDriver" in names_used(path)  # its driver is sim replay's, passes and tries
    assert not (names_used(path) | functions_defined(path)) & AIRLOCK_OWN_PLACEMENT


def functions_defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}


def test_the_caller_scan_sees_a_run_placed_by_hand(tmp_path: Path) -> None:
    sample = tmp_path / "own.py"
    sample.write_text(
        "class R:\n"
        "    def _router_tick(self):\n"
        "        best = max(self.gpus, key=self._held_bytes)\n"
        "        self._place(self.queue.pop(), best, 0.0)\n"
    )
    assert callers_of(sample, "_place") == {"_router_tick"}
    found = names_used(sample) | functions_defined(sample)
    assert found & AIRLOCK_OWN_PLACEMENT == {"_router_tick", "_held_bytes"}


#: The core's steps of an Airlock move (whether to move, the copy journaled, the commit's
#: outcome, the move over): strung once, in laminar_zone.trying.readdress_steps.
MOVE_STEPS = frozenset({"readdress", "move_to", "move_committed", "moved"})


def test_the_router_and_the_simulators_drive_one_move() -> None:
    """An Airlock move's steps are strung once, in laminar_zone.trying.readdress_steps: the
    router's AgentReports and sim airlock's glue (zone_driver.readdress_at_once) drive it,
    and neither they nor any other simulator module feeds a move's steps to a core
    itself."""
    root = Path(laminar_sim.__file__).parents[1]
    package = Path(laminar_sim.__file__).parent
    reports = root / "laminar_zone" / "reports.py"
    glue = package / "zone_driver.py"
    offenders = {
        str(p.relative_to(root)): sorted(core_calls(p) & MOVE_STEPS)
        for p in [reports, *sorted(package.rglob("*.py"))]
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert "readdress_steps" in calls(reports) and "readdress_steps" in calls(glue)
    assert core_calls(root / "laminar_zone" / "trying.py") >= MOVE_STEPS


def test_the_move_scan_sees_a_move_strung_by_hand(tmp_path: Path) -> None:
    sample = tmp_path / "move.py"
    sample.write_text(
        "def f(core, entry, old, member, failure):\n"
        "    placement, _, out = core.move_to(entry, old, member)\n"
        "    out += core.move_committed(entry, old, placement, failure, 0.0)\n"
    )
    assert core_calls(sample) & MOVE_STEPS == {"move_to", "move_committed"}
