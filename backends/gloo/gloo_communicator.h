// The Gloo communicator plugin: braid::Communicator over Gloo's TCP transport, for tensors on
// CPU devices (Send/Recv between ranks of one host through shared memory instead). Registered
// as "gloo" by libbraid_gloo.so (plugin.cc); a program builds one with
//
//   CommunicatorOptions o;  // rank, size, store (the job's rendezvous store), timeout
//   o.options["hostname"] = "10.0.0.1";  // this host's address as peers reach it
//   auto comm = Registry::Get().MakeCommunicator("gloo", o);
//
// Options (CommunicatorOptions::options; unknown keys are an error, to catch typos):
//   hostname             address to listen on and advertise (default 127.0.0.1)
//   iface                network interface to take the address from (instead of hostname)
//   group_name           the group's name in error messages (default "world")
//   store_prefix         namespace of this communicator's keys in the store (default "gloo");
//                        a second communicator made in the same process with the same prefix
//                        gets "<prefix>.<n>" (the n-th), so every rank must create its
//                        communicators in the same order. A restarted job needs a fresh store
//                        namespace: stale addresses under the same keys cannot be told apart.
//   heartbeat_ms         how often each rank publishes its progress (default 1000)
//   allreduce_algorithm  auto | ring | bcube | direct (default auto: direct while (size - 1) x
//                        bytes <= direct_max_bytes, then bcube up to bcube_max_bytes, then ring)
//   direct_max_bytes     see above (default 256 KiB)
//   bcube_max_bytes      see above (default 4 MiB)
//   segment_bytes        pipelining unit of the ring algorithms (default 4 MiB: on loopback
//                        fewer, larger messages beat Gloo's 1 MiB)
//   shm                  on | off (default on): Send/Recv between ranks of one host through
//                        shared-memory rings (shm_link.h); the trainer sets it from
//                        $BRAID_GLOO_SHM
//   shm_ring_bytes       each ring's size (default 4 MiB; one ring per direction of a pair
//                        that exchanges messages, reserved in /dev/shm when first used)
//   shm_spin_us          how long a Recv polls before it sleeps (default: 2000 if this host
//                        has a CPU for each of its $LOCAL_WORLD_SIZE ranks, else 0); the
//                        trainer sets it from $BRAID_GLOO_SHM_SPIN_US
//
// Execution. Every call returns a Work at once. Collectives run one at a time, in issue order,
// on the communicator's own worker thread: every rank must issue the same collectives in the same
// order (calls from several threads are safe, but then their interleaving is that order).
// Send/Recv are posted to the transport on the caller's thread (posting never blocks, so Sends
// and Recvs issued by both sides in any order always meet) and completed by the thread that
// waits for them (a thread of their own only when polled or dropped unwaited). Between two ranks
// of one host (same boot, same /dev/shm, same pid namespace, as each rank publishes when the
// communicator is made) they go through a pair of shared-memory rings: the sender copies the
// message in when it posts it, the receiver copies it out when it waits, and no transport thread
// takes a core from a computing rank (issue 11's pipeline bubble). Otherwise over Gloo's TCP.
// Until its Work is done, a call's output must not be read and its input not written. The
// communicator keeps the tensors alive meanwhile; destroying it waits for the queued work.
//
// Data types. Data movement (all-gather, broadcast, send/recv) takes any dtype. Reductions:
// f32, i32, i64, u8 and i8 natively (sum/max/min; integer sums wrap or overflow like C++);
// bf16 and f16 are up-cast to f32, reduced in f32 and rounded back once (Gloo has no bf16
// arithmetic, and one rounding at the end is more accurate than rounding at every ring step).
// kAvg (floating dtypes only) is a sum followed by a division by the group size.
//
// Algorithms (chosen from the size, which every rank agrees on). All-reduce, on the tensor's own
// memory (no copy for native dtypes): small buffers go straight to every peer, which reduces
// them in rank order (one message of latency); mid-sized ones take Gloo's bcube (log2(n)
// exchanges); large ones Gloo's ring, whose segments overlap the reduction with the transfer.
// Reduce-scatter (equal or uneven blocks): a pipelined ring over Gloo's unbound buffers, written
// here because Gloo's ReduceScatterHalvingDoubling binds buffers to one tensor's memory and takes
// fresh transport slots per instance, so instances could only be cached per tensor address,
// which ranks do not agree on. All-gather: Gloo's allgather (equal blocks) or allgatherv
// (uneven); an input that is exactly this rank's block of the output is gathered in place, any
// other input must not overlap the output. Broadcast, reduce, barrier: Gloo's. Scratch memory
// (bf16 up-casts, ring buffers) is kept and reused from call to call.
//
// Timeouts and failures. Every operation runs under the communicator's timeout (read when the
// call is issued). On a timeout or a transport error the Work's status names the operation, its
// sequence number, the group and the ranks that did not arrive (each rank publishes its progress,
// the number of the last collective it started, to the store: soon after each start and on a
// heartbeat), what each of those last reported, and this rank's recent operations. Gloo then
// closes this rank's connections, so every later call fails at once naming the first failure:
// make a new communicator to go on. A call with invalid arguments fails its Work with
// InvalidArgument and breaks the communicator too (its peers are left waiting in that
// collective; they are told why when they time out). Wait() gives up after the timeout plus a
// few seconds even if the operation is still queued behind a slow one.
//
// Sub-groups (NewGroup) get their own Gloo context (connections) under the store namespace
// "<prefix>/g<seq>", sharing this communicator's transport device. Non-members get nullptr and
// take no part in the rendezvous; members that pass different lists are told so.
//
// The store must be thread-safe and keep values byte for byte (Gloo's addresses are binary):
// the heartbeat thread writes to it while collectives run. Waits on it are cut into 100 ms
// slices, so a client that serializes its requests is never held long by this communicator.
#ifndef BRAID_BACKENDS_GLOO_GLOO_COMMUNICATOR_H_
#define BRAID_BACKENDS_GLOO_GLOO_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/communicator.h"

namespace braid::gloo_backend {

// Joins the group described by `options` (blocking until every rank has joined, or the
// timeout, which names the ranks that did not). The factory registered as "gloo".
absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(
    const CommunicatorOptions& options);

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_GLOO_COMMUNICATOR_H_
