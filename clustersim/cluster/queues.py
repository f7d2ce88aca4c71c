"""The scheduler's queue of waiting jobs, kept in order as jobs come and go.

A pass of the scheduler walks the queue from its head and stops at the first job that does
not fit (FIFO, priority) or tries the rest for backfill: it must not sort or rescan every
waiting job at every pass. Jobs are kept sorted by their queue key (fixed while a job
waits: priority, time queued, index) in a list updated by bisection, and the sizes waiting
are counted so a backfill pass stops as soon as nothing that waits can fit.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustersim.cluster.jobrun import JobRun
    from clustersim.cluster.quotas import TeamBook

__all__ = ["JobQueue", "FairShareQueue", "FairShareWalk", "ActiveJobs"]


class JobQueue:
    """Waiting jobs in queue order (`key(run)`, unique per job: it ends with the index)."""

    def __init__(self, key: Callable[[JobRun], tuple],
                 shortest: Callable[[JobRun], float] | None = None):
        self.key = key
        # A lower bound of each job's run time, fixed while it waits (backfill's walk skips
        # a team's jobs of a size when none is short enough); None: nothing known.
        self.shortest = shortest
        self._keys: list[tuple] = []
        self._runs: dict[int, JobRun] = {}
        self._key_of: dict[int, tuple] = {}
        self.sizes: Counter = Counter()  # instances needed -> jobs waiting
        # (team, instances needed) -> their keys, sorted, and their run times' lower bounds,
        # ascending; team -> its sizes waiting, ascending
        self._groups: dict[tuple[str, int], list[tuple]] = {}
        self._group_runtimes: dict[tuple[str, int], list[float]] = {}
        self._runtime_of: dict[int, float] = {}
        self._team_sizes: dict[str, list[int]] = {}
        # Each group's first key, as (key, team, size), sorted: a walk from the head merges
        # these as it goes (`_from_head`) instead of looking every group up at every pass.
        self._heads: list[tuple] = []

    def append(self, run: JobRun) -> None:
        """Queue a job (its key is taken now and kept while it waits)."""
        if run.index in self._runs:
            return
        key = self.key(run)
        bisect.insort(self._keys, key)
        group = (run.team, run.instances_needed)
        if group not in self._groups:
            self._groups[group] = []
            self._group_runtimes[group] = []
            bisect.insort(self._team_sizes.setdefault(run.team, []), run.instances_needed)
        same = self._groups[group]
        bisect.insort(same, key)
        if same[0] == key:  # its group's first now
            if len(same) > 1:
                self._drop_head(same[1], group)
            bisect.insort(self._heads, (key, *group))
        runtime = self.shortest(run) if self.shortest is not None else -math.inf
        self._runtime_of[run.index] = runtime
        bisect.insort(self._group_runtimes[group], runtime)
        self._runs[run.index] = run
        self._key_of[run.index] = key
        self.sizes[run.instances_needed] += 1

    def remove(self, run: JobRun) -> None:
        key = self._key_of.pop(run.index)
        del self._runs[run.index]
        del self._keys[bisect.bisect_left(self._keys, key)]
        group = (run.team, run.instances_needed)
        same = self._groups[group]
        at = bisect.bisect_left(same, key)
        del same[at]
        if at == 0:  # its group's first: the next one is
            self._drop_head(key, group)
            if same:
                bisect.insort(self._heads, (same[0], *group))
        runtimes = self._group_runtimes[group]
        del runtimes[bisect.bisect_left(runtimes, self._runtime_of.pop(run.index))]
        if not same:
            del self._groups[group]
            del self._group_runtimes[group]
            sizes = self._team_sizes[run.team]
            del sizes[bisect.bisect_left(sizes, run.instances_needed)]
            if not sizes:
                del self._team_sizes[run.team]
        self.sizes[run.instances_needed] -= 1
        if not self.sizes[run.instances_needed]:
            del self.sizes[run.instances_needed]

    def _drop_head(self, key: tuple, group: tuple[str, int]) -> None:
        heads = self._heads
        del heads[bisect.bisect_left(heads, (key, *group))]

    def discard(self, run: JobRun) -> None:
        if run.index in self._runs:
            self.remove(run)

    def after(self, run: JobRun | tuple | None, limit: Callable[[], float],
              room: Callable[[str], float] | None = None,
              viable: Callable[[int, float], bool] | None = None) -> Iterator[JobRun]:
        """The jobs queued after `run` (or after a queue key; all of them when it is not
        queued), in queue order, but only those needing at most `limit()` instances and, with
        `room`, at most `room(team)` (its team's quota room, `TeamBook.room`), and, with
        `viable`, only a team's jobs of a size for which `viable(size, shortest)` holds
        (`shortest`: the lowest of their run times' bounds), all asked as the walk goes: a
        walk visits the jobs that could start, not every waiting job (a month's queue holds
        thousands over their team's quota, or too long to backfill). `limit()` may only fall
        during the walk, and so may `room` (a walker that frees quota starts a new walk), and
        `viable` may only turn false. Safe while the walker starts (removes) the job it was
        given."""
        if run is None or isinstance(run, tuple):
            start = run
        else:
            start = self._key_of.get(run.index)
        if start is None and viable is None:
            yield from self._from_head(limit, room)
            return
        heap = []
        top = limit()
        for team, sizes in self._team_sizes.items():
            bound = top if room is None else min(top, room(team))
            for size in sizes[: bisect.bisect_right(sizes, bound)]:
                keys = self._groups[(team, size)]
                if viable is not None and not viable(size, self._group_runtimes[
                        (team, size)][0]):
                    continue
                i = bisect.bisect_right(keys, start) if start is not None else 0
                if i < len(keys):
                    heap.append((keys[i], team, size))
        heapq.heapify(heap)
        while heap:
            key, team, size = heapq.heappop(heap)
            if size > limit() or (room is not None and size > room(team)):
                continue  # nothing of this team and size may start any more
            if viable is not None and not viable(size, self._group_runtimes[(team, size)][0]):
                continue  # none of them may start any more
            yield self._runs[key[-1]]
            keys = self._groups.get((team, size))
            if keys:
                i = bisect.bisect_right(keys, key)
                if i < len(keys):
                    heapq.heappush(heap, (keys[i], team, size))

    def _from_head(self, limit: Callable[[], float],
                   room: Callable[[str], float] | None) -> Iterator[JobRun]:
        """`after(None, limit, room)`: the groups' first keys (kept sorted) merged with the
        next key of each group walked, each group looked at when its first key comes up. A
        group over the bound then was over it at the start too (the bounds only fall): the
        same jobs in the same order as a heap of every group's first key."""
        heads = self._heads.copy()  # (the walker removes the jobs it starts)
        heap: list[tuple] = []
        position = 0
        while True:
            if position < len(heads) and (not heap or heads[position] < heap[0]):
                key, team, size = heads[position]
                position += 1
            elif heap:
                key, team, size = heapq.heappop(heap)
            else:
                return
            if size > limit() or (room is not None and size > room(team)):
                continue  # nothing of this team and size may start any more
            yield self._runs[key[-1]]
            keys = self._groups.get((team, size))
            if keys:
                i = bisect.bisect_right(keys, key)
                if i < len(keys):
                    heapq.heappush(heap, (keys[i], team, size))

    def key_of(self, run: JobRun) -> tuple:
        """The queue key of a waiting job."""
        return self._key_of[run.index]

    def __contains__(self, run: object) -> bool:
        return getattr(run, "index", None) in self._runs and self._runs[run.index] is run

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[JobRun]:
        return (self._runs[key[-1]] for key in list(self._keys))

    def smallest(self) -> int:
        """The fewest instances any waiting job needs (0 when none waits)."""
        return min(self.sizes) if self.sizes else 0

    def ordered(self) -> Iterator[JobRun]:
        """Jobs in queue order, walked by position: safe while the walker starts (removes)
        the job it was given, the next one then moves up to its position (no copy of the
        queue per pass)."""
        position = 0
        while position < len(self._keys):
            key = self._keys[position]
            yield self._runs[key[-1]]
            if position < len(self._keys) and self._keys[position] == key:
                position += 1  # still there: step past it

    def first_key(self) -> tuple | None:
        """The queue key of the head (None: the queue is empty)."""
        return self._keys[0] if self._keys else None

    def at(self, position: int) -> JobRun:
        """The job at this position (0: the head). A pass walks the queue by position: a job
        it starts leaves the queue, and the next one moves up to its position."""
        return self._runs[self._keys[position][-1]]


class FairShareQueue:
    """Waiting jobs by team, each team's in priority then FIFO order; walked team by team,
    the team furthest below its fair share (instances held over its weight) first, its
    position looked at again after every job (a start raises the team's share)."""

    def __init__(self, key: Callable[[JobRun], tuple], book: TeamBook,
                 shortest: Callable[[JobRun], float] | None = None):
        self.key = key
        self.book = book
        self.shortest = shortest  # (`JobQueue`'s)
        self.teams: dict[str, JobQueue] = {}
        self.sizes: Counter = Counter()
        self._count = 0

    def append(self, run: JobRun) -> None:
        queue = self.teams.get(run.team)
        if queue is None:
            queue = self.teams[run.team] = JobQueue(self.key, self.shortest)
        if run in queue:
            return
        queue.append(run)
        self.sizes[run.instances_needed] += 1
        self._count += 1

    def remove(self, run: JobRun) -> None:
        self.teams[run.team].remove(run)
        self._count -= 1
        self.sizes[run.instances_needed] -= 1
        if not self.sizes[run.instances_needed]:
            del self.sizes[run.instances_needed]

    def discard(self, run: JobRun) -> None:
        if run in self:
            self.remove(run)

    def __contains__(self, run: object) -> bool:
        queue = self.teams.get(getattr(run, "team", None))
        return queue is not None and run in queue

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[JobRun]:
        return iter(list(self.ordered()))

    def smallest(self) -> int:
        return min(self.sizes) if self.sizes else 0

    def turn(self, team: str) -> tuple:
        """Which team's turn comes first: the furthest below its share; between teams as far
        below (two holding nothing), the one whose first waiting job (by priority, then
        time queued) came first, not the first name: a team named later waited behind every
        tie and could starve."""
        first = self.teams[team].first_key()
        # (a team whose last job just started has none: its walk ends when its turn comes)
        return (self.book.share(team), (0, first) if first is not None else (1,), team)

    def ordered(self, admissible: bool = False) -> Iterator[JobRun]:
        """The walk; `admissible`: only the jobs their team's quota room (`TeamBook.room`)
        admits when their turn comes (`FairShareWalk`, the scheduler's walk)."""
        if admissible:
            return FairShareWalk(self)
        return self._every()

    def _every(self) -> Iterator[JobRun]:
        cursor = {team: 0 for team, queue in self.teams.items() if len(queue)}
        while cursor:
            team = min(cursor, key=self.turn)
            queue = self.teams[team]
            run = queue.at(cursor[team])
            yield run
            if cursor[team] < len(queue) and queue.at(cursor[team]) is run:
                cursor[team] += 1  # still there: step past it
            if cursor[team] >= len(queue):
                del cursor[team]


def _no_limit() -> float:
    return math.inf


class FairShareWalk:
    """`FairShareQueue.ordered(admissible=True)`: the team furthest below its fair share
    first, each team's jobs in queue order, but only those of a size its quota room admits
    (`JobQueue.after` with `room`). The walk of every job yields the others too, one after
    another, while the team's share stays put: the scheduler refused each in turn (a pass
    of a 20,000-job fleet stepped past thousands of jobs larger than their team's room).
    Safe while the walker starts (removes) the job it was given. The rooms may only fall
    during a walk; a walker whose preemption gave quota back calls `rooms_rose` (every
    team's walk resumes after the last job it gave, its sizes looked at again)."""

    def __init__(self, queue: FairShareQueue):
        self.queue = queue
        room = queue.book.room
        self.walks = {team: jobs.after(None, _no_limit, room)
                      for team, jobs in queue.teams.items() if len(jobs)}
        self.last: dict[str, tuple | None] = dict.fromkeys(self.walks)

    def __iter__(self) -> FairShareWalk:
        return self

    def __next__(self) -> JobRun:
        turn = self.queue.turn
        while self.walks:
            team = min(self.walks, key=turn)
            run = next(self.walks[team], None)
            if run is None:
                del self.walks[team]
                continue
            self.last[team] = self.queue.teams[team].key_of(run)
            return run
        raise StopIteration

    def rooms_rose(self) -> None:
        self.narrowed(_no_limit, self.queue.book.room)

    def narrowed(self, limit: Callable[[], float], room: Callable[[str], float],
                 viable: Callable[[int, float], bool] | None = None) -> FairShareWalk:
        """The walk on from here, each team's after the last job it gave, with `JobQueue.after`'s
        bounds (backfill's: the free instances, the quota room, the sizes whose jobs could
        end before the reservation or fit beside it)."""
        for team in self.walks:
            self.walks[team] = self.queue.teams[team].after(self.last[team], limit, room,
                                                            viable)
        return self


class ActiveJobs:
    """The jobs holding instances or granted them, with how many of each priority: a job
    that cannot fit looks for lower-priority victims only when there are some.

    Backfill asks at every pass when they are expected to end (`expected_ends`). A started
    job with a run time and no step target ends at its start plus its run time, whatever
    happens meanwhile: those are kept sorted by that end as they come and go, and only the
    others are asked again at each pass (not every running job of a 100,000-job mix)."""

    def __init__(self) -> None:
        self._runs: set[JobRun] = set()
        self.priorities: Counter = Counter()
        self._fixed: list[tuple[float, int]] = []  # (expected end, index), sorted
        self._fixed_entry: dict[int, tuple[float, int]] = {}
        self._fixed_runs: dict[int, JobRun] = {}
        self._live: set[JobRun] = set()  # the others: their end asked at each use
        # Preemption's order within a priority: latest started first (start time, fixed once
        # started, negated; then index), kept sorted; jobs not started yet aside.
        self._started: dict[int, list[tuple[float, int]]] = {}
        self._started_entry: dict[int, tuple[float, int]] = {}
        self._unstarted: set[JobRun] = set()
        self._by_index: dict[int, JobRun] = {}

    def add(self, run: JobRun) -> None:
        if run not in self._runs:
            self._runs.add(run)
            self.priorities[run.job.priority] += 1
            self._live.add(run)
            self._by_index[run.index] = run
            self._unstarted.add(run)

    def discard(self, run: JobRun) -> None:
        if run in self._runs:
            self._runs.remove(run)
            self.priorities[run.job.priority] -= 1
            if not self.priorities[run.job.priority]:
                del self.priorities[run.job.priority]
            entry = self._fixed_entry.pop(run.index, None)
            if entry is None:
                self._live.discard(run)
            else:
                del self._fixed[bisect.bisect_left(self._fixed, entry)]
                del self._fixed_runs[run.index]
            del self._by_index[run.index]
            started = self._started_entry.pop(run.index, None)
            if started is None:
                self._unstarted.discard(run)
            else:
                same = self._started[run.job.priority]
                del same[bisect.bisect_left(same, started)]

    def by_preemption_order(self, below: float) -> Iterator[JobRun]:
        """The jobs of priority below `below`, lowest priority first, then latest started
        first, then by index: the order preemption takes victims in (a job not started
        yet counts as started at 0), without sorting every running job at each call."""
        for run in [r for r in self._unstarted if r.outcome.start_s is not None]:
            self._unstarted.remove(run)
            entry = (-(run.outcome.start_s or 0.0), run.index)
            bisect.insort(self._started.setdefault(run.job.priority, []), entry)
            self._started_entry[run.index] = entry
        for priority in sorted(p for p in self.priorities if p < below):
            pending = sorted((-0.0, r.index) for r in self._unstarted
                             if r.job.priority == priority)
            # (a copy of the sorted keys: the caller may evict once it stops walking)
            for _, index in heapq.merge(list(self._started.get(priority, ())), pending):
                yield self._by_index[index]

    def expected_ends(self, head: JobRun) -> Iterator[tuple[float, int]]:
        """(expected end, instances held or granted) of each job but `head` that holds or
        was granted some, by end then instances: the list backfill sorts, lazily."""
        live = []
        for run in list(self._live):
            end = run.fixed_expected_end()
            if end is not None:  # started: its end is fixed from now on
                self._live.remove(run)
                entry = (end, run.index)
                bisect.insort(self._fixed, entry)
                self._fixed_entry[run.index] = entry
                self._fixed_runs[run.index] = run
            elif run is not head:
                count = run.backfill_count()
                if count:
                    live.append((run.expected_end(), count))
        live.sort()
        return heapq.merge(self._fixed_ends(head), live)

    def _fixed_ends(self, head: JobRun) -> Iterator[tuple[float, int]]:
        """The fixed ends in order; jobs ending at the same time by instances, as a sort of
        (end, instances) pairs would have them."""
        fixed, i = self._fixed, 0
        while i < len(fixed):
            end, j, counts = fixed[i][0], i, []
            while j < len(fixed) and fixed[j][0] == end:
                run = self._fixed_runs[fixed[j][1]]
                count = run.backfill_count() if run is not head else 0
                if count:
                    counts.append(count)
                j += 1
            for count in sorted(counts):
                yield end, count
            i = j

    def lowest_priority(self) -> float:
        return min(self.priorities) if self.priorities else float("inf")

    def __contains__(self, run: object) -> bool:
        return run in self._runs

    def __iter__(self) -> Iterator[JobRun]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)
