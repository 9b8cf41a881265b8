// Lowering: turns a schedule of forwards and backwards into one the engine can run on
// separate stages, by inserting the messages the dependency rule implies.
//
// Every compute action X whose output another stage needs (consumer_stages) is followed
// directly by a Send of that output to each such stage (sends are asynchronous/buffered).
// On the receiving stage, the Recv goes right before the first action that needs it; each
// channel (sender, receiver, payload) delivers in the sender's order, so when a stage needs
// a message that its sender sent after others still unreceived, it receives those first
// (they are already sent, so this never blocks longer than waiting for the needed one).
// Hence receive order == send order on every channel, and the lowered schedule runs exactly
// when the original does. For the rule today: after F on r < P-1 "sFm.c>r+1", before F on
// r > 0 "rFm.c<r-1"; after B on r > 0 "sBm.c>r-1", before B on r < P-1 "rBm.c<r+1".
//
// The engine interprets a lowered stage list in order: F/B run the stage's layers on the
// unit (its input taken from the matching receive, or the data/loss on the first/last
// stage), Send posts the output of the named action to the peer, Recv blocks for the next
// message from the peer, which is the named one.
#pragma once
#include "pipeline/schedule.h"

namespace stateflow {

// Takes an unlowered schedule (one that passes check_schedule) and returns it lowered.
Schedule lower_schedule(const Schedule& s);

}  // namespace stateflow
