"""Hand labels: the critical step of 20 failed tau-bench airline runs, as a person would mark it (issue 28).

Who, when, how (written before any root-cause rule of the diagnosis existed, and committed first):

- labeller: an engineer of the team, who is an AI agent (Claude, working on issue 28), not a human annotator;
- date: 2026-12-04, finished 19:35 UTC (commit e9ba103 and this one precede every root-cause rule);
- runs: the failed runs (reward < 1) of the team's tau-bench airline file (`tau-bench-airline-gpt-4o.json`,
  120 GPT-4o trajectories, 84 failed) in file order, every 4th one from the first: 20 runs;
- method: each trajectory read message by message (user, assistant, tool outputs, the task's instruction
  and expected actions alongside), and marked with the *critical step*: the first mistake of the agent that
  it never recovered from (a tool output misread, a policy check skipped before acting, a request
  misunderstood, a value made up, a wrong claim or refusal the run never undid), as an index into `traj`
  (the same as the canonical step index: one step per message). Where the wrong write is itself the first
  mistake, it is the label. No toolkit output, diagnosis or rule was looked at while labelling; the notes
  say what was seen. Uncertain calls say so (`sure=False`).

`CRITICAL[(task_id, trial)] = (step, sure, note)`.
"""

from __future__ import annotations

__all__ = ["CRITICAL", "LABELLER", "LABEL_DATE", "METHOD"]

LABELLER = "an engineer of the team: an AI agent (Claude), not a human annotator"
LABEL_DATE = "2026-12-04"
METHOD = "every 4th failed run of the tau-bench airline file, read in full; first unrecovered mistake"

CRITICAL: dict[tuple[int, int], tuple[int, bool, str]] = {
    (0, 0): (
        20,
        True,
        "book_reservation with nonfree_baggages 1: a value the agent made up (the user never "
        "gave the bags; its profile's membership decides them); kept in the retry at 28",
    ),
    (4, 0): (
        16,
        True,
        "update_reservation_flights paid with credit_card_7407366, a card read off another "
        "reservation's payment history (step 9), not the user's profile; the user was never asked",
    ),
    (9, 0): (
        2,
        True,
        "refuses to give the gift-card balances instead of asking the user id and reading the "
        "profile; never recovers (no user id, no lookup, no change)",
    ),
    (15, 0): (
        26,
        False,
        "cancels GV1N64, a change the task did not want (expected: no write), after offering it "
        "as an option at 22",
    ),
    (21, 0): (26, False, "books a new reservation the task did not want (expected: no write)"),
    (27, 0): (
        20,
        False,
        "searches only JFK-MCO direct and concludes there is no nonstop option (22), instead of "
        "the legs of the reservation; everything after builds on it (the update at 30)",
    ),
    (3, 1): (
        32,
        True,
        "recommends option 2 (HAT229 in basic economy) as the fastest though the user stays in "
        "economy: the search output (21) was misread; the write at 36 follows it",
    ),
    (8, 1): (
        2,
        True,
        "refuses to give the gift-card and certificate balances (they are in the profile the "
        "agent reads at 9); the sums the user asked for are never given",
    ),
    (14, 1): (
        18,
        True,
        "accepts upgrading only one passenger (policy: all passengers fly in the same cabin) "
        "and prices it; the write at 22 follows",
    ),
    (19, 1): (10, True, "searches the return on 2024-05-20; the reservation read at 5 returns on 2024-05-19"),
    (26, 1): (
        8,
        True,
        "says IFOYYZ (basic economy, booked days earlier, no insurance) is within the 24-hour "
        "window and may be cancelled: the policy check misread; cancelled at 10",
    ),
    (1, 2): (
        4,
        True,
        "insists on the reservation id instead of looking the reservations up from the user id; "
        "never recovers (ends in a transfer)",
    ),
    (6, 2): (
        12,
        True,
        "lists the options of the search output (11) wrongly: the cheapest economy pair "
        "(HAT110 + HAT172) is not offered as the cheapest",
    ),
    (11, 2): (
        10,
        True,
        "computes the certificate balance left from the old reservation's prices (158 + 141) "
        "instead of today's: the stated balance and the payment are wrong",
    ),
    (19, 2): (
        8,
        True,
        "offers a transfer to a human when the user doubts the itinerary, instead of doing the "
        "change; the run ends there",
    ),
    (28, 2): (32, False, "cancels I6M8JQ, whose flight already departed (2024-05-09, read at 25)"),
    (2, 3): (
        12,
        True,
        "states the user's business reservations after reading only 3 of them; the other "
        "business reservations are never downgraded",
    ),
    (6, 3): (
        12,
        True,
        "searches only the original legs (ATL-ORD, ORD-PHL) for the cheapest economy option; "
        "the cheaper one-stop pair via LGA is never seen",
    ),
    (10, 3): (8, True, "says H9ZU1C cannot be cancelled; the task expected the cancellation"),
    (19, 3): (10, True, "searches the return on 2024-05-20; the reservation read at 5 returns on 2024-05-19"),
}
