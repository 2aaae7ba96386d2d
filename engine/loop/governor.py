"""Never slower, never costlier: the cost governor backs speculation off where it stops paying.

Every step of the loop costs wall time and CPU time. A *plain* step (no draft) commits one token; its
cost is the reference `P`, a running average on both clocks, first taken by a short *probe* (one step
with drafting held back) as soon as a step needs judging. A drafted step that commits `c` tokens *paid*
when it cost at most `c * P` on both clocks, drafting included. Two cases need no clock: a draft rejected
outright never pays (it cost a longer forward and committed one token), and a cheap drafter's draft
accepted whole always does (one forward over k + 1 tokens costs less than k + 1 forwards of one token on
every device we measured). A model drafter's whole draft may still not pay: its k draft forwards cost
too (layer skip on a CPU: about 0.8 of a full forward each with 19 of 24 layers).

Each drafter (a *link*, by name) has a cap on its draft length, which it follows per request, and a
*balance*: the time its recent steps saved against plain decoding (each step's saving, `c * P` minus
what it cost, added to the balance; every step of the request, its own or not, decays it by
`BALANCE_DECAY`, so a link that was switched off forgets its losses while its probes come back):
- a step that did not pay, or any step while the balance is negative, halves the cap (from the length
  it drafted); a step that paid, with the balance positive, doubles it, up to the link's maximum. So a
  copy run keeps its long drafts, and new text shrinks them within a few steps: 64 -> 32 -> ... -> 1 ->
  off costs about as much as five plain tokens, once. The balance keeps a drafter near break-even from
  climbing back to long drafts on small wins and losing it all on one rejected long draft (layer skip
  on a CPU: 4-token wins saved 20-50 ms each, an 8-token draft with 2 accepted lost 560 ms).
- at cap 0 the link is *off*. A cheap link (the copy drafter: a proposal costs microseconds) keeps
  proposing in the shadow; when a shadow draft would have been accepted (its first token is the token
  the target wrote), the copy has found a match again and the cap comes back at 2. An expensive link
  (a draft model, layer skip: a proposal costs forwards) is probed with a one-token draft after a
  cool-down, which doubles every time a probe does not pay. When it is asked and proposes nothing (its
  first token was below `p_min`), it spent a forward for nothing: that halves its cap too, and the step
  does not count as a plain one.

A draft model must first read its *backlog*, what was committed since it last drafted (the whole prompt
the first time, then each copy run): on a CPU a forward of that many rows, which can cost more than its
draft will save (the 1.5B model drafted for by the 0.5B on a CPU: 399 tokens read in 1.1 s, to draft 8
tokens that saved 0.35 s; docs/drafting.md). Whether it pays depends on how long the text the copy does
not cover goes on, which nobody knows in advance: ski rental. Each step on which the link would have
drafted but its backlog held it back adds what a caught-up draft would have saved (`RENT` of a plain
step) to its *rent*; it catches up once the backlog costs no more than the rent plus this step's saving,
priced per token as its last catch-up measured (`CATCH_UP_ROW` of a plain step before one). So a short
edit in a long file is decoded plainly, and long new text pays the catch-up once, after waiting about as
long as the catch-up costs. The catch-up is not counted when the step itself is judged: it was paid for
the steps that follow as much as for that one. Its last token is counted: a caught-up draft model reads
one token a step too, the forward that gives its first draft token (left out, it made every draft look
20 ms, half a plain step, cheaper than it was: the 1.5B model on a CPU, docs/drafting.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from specedit.drafters.base import NO_DRAFT, CatchesUp, Draft, Drafter
from specedit.engine.loop.step import StepRecord
from specedit.engine.records.stats import DrafterStats, Stats

# The plain cost is a running average of plain steps: new ones weigh this much. Plain steps vary by
# ~10% here (other processes share the cores); 0.3 follows the slow growth of the attention cost.
PLAIN_COST_WEIGHT = 0.3
# A plain-cost estimate older than this many committed tokens is re-probed before it judges a step.
PLAIN_COST_AGE = 512
FIRST_COOLDOWN = 4  # steps before an expensive link that was switched off is probed again
MAX_COOLDOWN = 64
REVIVED_CAP = 2  # the cap of a link that comes back on
BALANCE_DECAY = 0.9  # per step of the request: the balance remembers about the last ten steps
# What a caught-up draft model saves a token, in plain steps (ski rental's rent: see above; the 0.5B drafting
# for the 1.5B saved 0.42-0.44 on drafts accepted whole), and what a backlog token costs it to read, until
# its first catch-up is measured (0.045 there: 2.7-3.0 ms against 64 ms plain steps on 2 AVX2 cores).
RENT = 0.4
CATCH_UP_ROW = 0.05
CATCH_UP_SAMPLE = 16  # a catch-up of this many tokens or more prices the next (fewer are mostly overhead)


@dataclass
class LinkState:
    """The governor's view of one drafter."""

    max_cap: int
    cheap: bool
    cap: int = 0
    cooldown: int = FIRST_COOLDOWN  # the next cool-down of an expensive link
    waiting: int = 0  # steps left before an expensive link that is off is probed
    suppressed: int = 0  # steps on which the link was off or held back
    backoffs: int = 0  # steps that did not pay
    balance: float = 0.0  # seconds its recent steps saved against plain decoding (decayed)
    rent: float = 0.0  # seconds it could have saved while its backlog held it back, since it last caught up
    row_seconds: float | None = None  # what a backlog token cost it to read, as last measured
    sunk: float = 0.0  # this step's catch-up, in seconds: left out when the step is judged

    def __post_init__(self) -> None:
        self.cap = self.max_cap


class CostGovernor:
    """Caps each drafter's drafts by what they saved so far in this request; see the module docstring."""

    def __init__(self) -> None:
        self.links: dict[str, LinkState] = {}
        self.plain_wall: float | None = None
        self.plain_cpu: float | None = None
        self._plain_position = 0  # committed length when the plain cost was last measured
        self._probe = False  # hold all drafting back for one step, to measure the plain cost
        self._unjudged: StepRecord | None = None  # a step that needs the plain cost, until the probe
        self._drafting_spent = False  # this step, an expensive link drafted and proposed nothing
        self.probes = 0

    def gate(self, drafter: Drafter, name: str, *, max_draft: int, cheap: bool) -> Drafter:
        """`drafter` under this governor, as the link `name`; its drafts carry the name as their source."""
        if name in self.links:
            raise ValueError(f"a link named {name!r} is already governed")
        self.links[name] = LinkState(max_cap=max_draft, cheap=cheap)
        return GatedDrafter(drafter, name, self)

    @property
    def probing(self) -> bool:
        return self._probe

    def record(self, step: StepRecord) -> None:
        """The engine reports every step's cost; the drafting link's cap follows whether it paid."""
        for state in self.links.values():  # every step ages every balance, so a link that is off forgets
            state.balance *= BALANCE_DECAY  # its losses and can come back after its probes pay
        if step.drafted == 0:
            if not self._drafting_spent:
                self._record_plain(step)
            self._drafting_spent = False
            return
        link = self.links.get(step.source)
        if link is None:
            return  # an ungoverned drafter
        if link.sunk:
            step = _without(step, link.sunk)
            link.sunk = 0.0
        plain_known = self.plain_wall is not None and step.position - self._plain_position <= PLAIN_COST_AGE
        if step.accepted == 0:
            self._judge(link, step, paid=False)
        elif step.accepted == step.drafted and link.cheap and not plain_known:
            self._judge(link, step, paid=True)
        elif not plain_known:
            self._unjudged = step  # judged by the probe that follows
            self._probe = True
        else:
            self._judge(link, step)

    def report(self, stats: Stats) -> None:
        """Into a generation's stats: the steps each link was held back, and the probes taken."""
        for name, link in self.links.items():
            stats.drafters.setdefault(name, DrafterStats()).held_back_steps = link.suppressed
        stats.cost_probes = self.probes

    def revive(self, name: str) -> None:
        """A link that was off would have drafted well: back on, with a short cap."""
        link = self.links[name]
        link.cap = max(link.cap, min(REVIVED_CAP, link.max_cap))

    def proposed_nothing(self, name: str) -> None:
        """The link was asked and had no proposal; for an expensive link that cost a forward."""
        link = self.links[name]
        if not link.cheap:
            self._drafting_spent = True
            link.backoffs += 1
            link.cap //= 2
            if link.cap == 0:
                self._switch_off(link)

    def _record_plain(self, step: StepRecord) -> None:
        if self.plain_wall is None or self.plain_cpu is None:
            self.plain_wall, self.plain_cpu = step.wall_seconds, step.cpu_seconds
        else:
            w = PLAIN_COST_WEIGHT
            self.plain_wall = (1 - w) * self.plain_wall + w * step.wall_seconds
            self.plain_cpu = (1 - w) * self.plain_cpu + w * step.cpu_seconds
        self._plain_position = step.position
        if self._probe:
            self._probe = False
            self.probes += 1
        if self._unjudged is not None:
            unjudged, self._unjudged = self._unjudged, None
            link = self.links.get(unjudged.source)
            if link is not None:
                self._judge(link, unjudged)

    def _saving(self, step: StepRecord) -> float | None:
        """Seconds the step saved against plain decoding of its committed tokens, on the worse of the
        two clocks (CPU time scaled to wall time); None while the plain cost is unknown."""
        if self.plain_wall is None or self.plain_cpu is None:
            return None
        wall = step.committed * self.plain_wall - step.wall_seconds
        cpu = step.committed * self.plain_cpu - step.cpu_seconds
        return min(wall, cpu * self.plain_wall / self.plain_cpu if self.plain_cpu > 0 else cpu)

    def _judge(self, link: LinkState, step: StepRecord, *, paid: bool | None = None) -> None:
        saving = self._saving(step)
        if saving is not None:
            link.balance += saving
        if paid is None:
            paid = saving is not None and saving >= 0
        if paid and link.balance >= 0:
            link.cap = min(link.max_cap, max(2 * link.cap, 2 * step.drafted))
            link.cooldown = FIRST_COOLDOWN
            return
        link.backoffs += 1
        link.cap = step.drafted // 2
        if link.cap == 0:
            self._switch_off(link)

    @staticmethod
    def _switch_off(link: LinkState) -> None:
        if not link.cheap:
            link.waiting = link.cooldown
            link.cooldown = min(2 * link.cooldown, MAX_COOLDOWN)


def _without(step: StepRecord, seconds: float) -> StepRecord:
    """`step` less `seconds` of its wall time, and the same share of its CPU time."""
    share = min(1.0, seconds / step.wall_seconds) if step.wall_seconds > 0 else 0.0
    return replace(step, wall_seconds=step.wall_seconds * (1 - share), cpu_seconds=step.cpu_seconds * (1 - share))


class GatedDrafter:
    """A drafter under a `CostGovernor`: its proposals are cut to the link's cap, or held back."""

    def __init__(self, inner: Drafter, name: str, governor: CostGovernor) -> None:
        self.inner = inner
        self.name = name
        self._governor = governor
        self._link = governor.links[name]
        self._asked = False  # `inner` proposed this step and awaits its feedback
        self._shadow: tuple[int, int] | None = None  # (position, first token) of a held-back proposal
        # a drafter that reads a backlog before proposing (a draft model): gated by what that costs
        self._catches_up = inner if isinstance(inner, CatchesUp) and not self._link.cheap else None

    def propose(self, context: Sequence[int], k: int) -> Draft:
        self._settle_shadow(context)
        link = self._link
        if self._governor.probing:
            link.suppressed += 1
            return NO_DRAFT
        if link.cap == 0:
            link.suppressed += 1
            if link.cheap:
                shadow = self.inner.propose(context, k)
                self._asked = False
                self._shadow = (len(context), shadow.tokens[0]) if shadow.tokens else None
                if self._shadow is None:
                    self.inner.observe(0)
                return NO_DRAFT
            if link.waiting > 0:
                link.waiting -= 1
                return NO_DRAFT
            link.cap = 1  # the probe
        catches_up = self._catches_up
        if catches_up is not None and not self._catching_up_pays(catches_up, context):
            link.suppressed += 1
            return NO_DRAFT
        draft = self.inner.propose(context, min(k, link.cap))
        self._asked = True
        if catches_up is not None:
            self._caught_up(*catches_up.caught_up, drafted=bool(draft.tokens))
        if not draft.tokens:
            self._governor.proposed_nothing(self.name)
            return draft
        return replace(draft, source=self.name)

    def observe(self, n_accepted: int) -> None:
        if self._asked:
            self._asked = False
            self.inner.observe(n_accepted)

    def _catching_up_pays(self, inner: CatchesUp, context: Sequence[int]) -> bool:
        """Ski rental (see the module docstring): whether the rent covers reading the backlog now. Until a
        plain step has been timed, no: that step prices both."""
        link, plain = self._link, self._governor.plain_wall
        if plain is None:
            return False
        row = link.row_seconds if link.row_seconds is not None else CATCH_UP_ROW * plain
        if inner.backlog(context) * row <= link.rent + RENT * plain:
            link.rent = 0.0
            return True
        link.rent += RENT * plain
        return False

    def _caught_up(self, tokens: int, seconds: float, *, drafted: bool) -> None:
        """The proposal read `tokens` in `seconds`. A caught-up drafter reads one token (the target's last,
        whose logits give its first draft token): that share is this step's own cost; the rest of the
        backlog is sunk, left out when the step is judged (a step it drafted nothing for is not judged)."""
        link = self._link
        link.sunk = seconds * (tokens - 1) / tokens if drafted and tokens > 1 else 0.0
        if tokens >= CATCH_UP_SAMPLE:
            link.row_seconds = seconds / tokens

    def _settle_shadow(self, context: Sequence[int]) -> None:
        """Feedback for a held-back proposal: whether the target then wrote its first token."""
        if self._shadow is None:
            return
        position, first = self._shadow
        self._shadow = None
        hit = len(context) > position and context[position] == first
        self.inner.observe(1 if hit else 0)
        if hit:
            self._governor.revive(self.name)
