"""Every bound ring enforces, in one place, named with its unit last.

A limit that is not here does not exist. Each carries a comment saying why
that number. The table in docs/LIMITS.md is generated from this module by
``python -m ring.limits --write docs/LIMITS.md`` (without ``--write`` it is
printed) and tests/test_readme.py keeps the two in step.
"""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024 * KiB

# --- records and requests ----------------------------------------------------

# One record (key + value + headers) as stored. Kafka's default is 1 MiB; a
# bigger event belongs in object storage with a pointer in the log.
MESSAGE_BYTES_MAX = 1 * MiB

# One produce request body, counted while streaming (not only Content-Length).
# 16 records at the maximum size, or ~16k records of 1 KiB: big enough to
# batch well, small enough that a handful of such requests cannot exhaust RAM.
REQUEST_BYTES_MAX = 16 * MiB

# Records in one produce request. Bounds the per-request work and response size.
RECORDS_PER_REQUEST_MAX = 50_000

# One NDJSON line, or one event of a JSON body as sent (whitespace included): a
# maximal record plus room for JSON escaping. Checked before the event is parsed.
NDJSON_LINE_BYTES_MAX = MESSAGE_BYTES_MAX + 64 * KiB

# JSON nesting depth accepted in an event: deep nesting is an attack on the
# parser (stack exhaustion), not a use case.
JSON_DEPTH_MAX = 64

# Headers on one record: metadata, not a second payload.
HEADERS_PER_RECORD_MAX = 64
# Bytes of one header name (header values count toward MESSAGE_BYTES_MAX).
HEADER_NAME_BYTES_MAX = 256

# A record key (query parameter or field). Keys are for placement, not payload.
KEY_BYTES_MAX = 4 * KiB

# One stored record batch as sent by a client (application/vnd.ring.batch) or
# built from one request, header included. Kafka's max.message.bytes semantics:
# it bounds a whole batch, so a maximal record plus framing still fits.
BATCH_BYTES_MAX = MESSAGE_BYTES_MAX + 64 * KiB

# Body of an administrative request (create topic, truncate): a few fields of JSON.
ADMIN_BODY_BYTES_MAX = 64 * KiB

# --- fetch and long-poll -----------------------------------------------------

# Records in one fetch answer when the client does not say.
FETCH_RECORDS_DEFAULT = 500
# Records in one fetch answer: bounds the JSON a broker builds for one request.
FETCH_RECORDS_MAX = 10_000
# Bytes of stored batches read for one fetch when the client does not say.
FETCH_BYTES_DEFAULT = 1 * MiB
# Bytes of stored batches read for one fetch; at least one whole batch is
# always returned so a consumer can make progress past a big record.
FETCH_BYTES_MAX = 16 * MiB

# Longest a fetch may long-poll. Above this, proxies and load balancers start
# cutting idle connections (many default to 60 s).
LONG_POLL_WAIT_MS_MAX = 30_000
# Long-polls open at once on one broker; each holds a connection and a waiter.
LONG_POLLS_OPEN_MAX = 1_000

# --- connections -------------------------------------------------------------

# A client must send its request headers within this; dribbling headers is the
# slowloris attack.
HEADER_READ_TIMEOUT_S = 10.0
# A client must send the whole body within this once headers are in.
BODY_READ_TIMEOUT_S = 30.0
# Idle keep-alive connections are closed after this: a client that holds one open without a
# request costs a connection slot and buffers.
KEEPALIVE_TIMEOUT_S = 75.0
# Bytes of one request line (else 414) or header line (else 431).
HEADER_LINE_BYTES_MAX = 8 * KiB
# Bytes of a request's whole head (request line and every header), else 431: many
# short header lines add up too. Far above what any client sends (a few hundred
# bytes; a client token and a carried identity a few KiB).
REQUEST_HEAD_BYTES_MAX = 64 * KiB
# Header fields of one request (trailers included), else 431: each is an entry of
# the request's headers, so a head of thousands of short fields would cost many
# times its bytes in objects. Apache's LimitRequestFields; clients send a dozen.
REQUEST_HEADER_FIELDS_MAX = 100
# Requests one connection may have parsed and not yet answered (pipelined): beyond
# it the broker stops reading from that connection until answers have gone out,
# so a client cannot queue requests (and their bodies) without bound.
PIPELINED_REQUESTS_MAX = 32
# At most the shortest request the parser completes ("GET / HTTP/1.1" and two
# CRLFs, 18 bytes; 16 if line ends were LF alone; an HTTP/0.9 "GET /" is 9, but
# the parser takes nothing after it): fed at most this many bytes per
# request the pipeline has room for, the parser cannot complete more requests than
# there is room for, so the bound above holds while a read is parsed, not after.
REQUEST_BYTES_MIN = 16
# What one read of a connection hands the front (asyncio's read size): when the
# pipeline is full, the rest of the read waits unparsed, reading paused, until
# answers have gone out; a connection never holds more unparsed bytes than this.
CONNECTION_UNPARSED_BYTES_MAX = 256 * KiB
# Bytes of answers one connection may have built and not yet sent (waiting their
# turn, or in the transport's buffer): past it, or while the transport has asked
# for no more writes, the connection runs none of its pipelined requests until
# its client has taken what is there. A client that pipelines and never reads
# holds this plus one answer, not an answer per request.
CONNECTION_ANSWER_BYTES_MAX = 1 * MiB
# The same for all client connections together: past it no connection that
# holds an unsent answer runs its next request (their pipelines fill and reading
# stops) until clients have taken answers, while clients that read (holding
# nothing) go on; so CLIENT_CONNECTIONS_OPEN_MAX slow readers hold this and one
# answer each, not CONNECTION_ANSWER_BYTES_MAX each. Fetch answers are also
# held in FETCH_ANSWER_BYTES_IN_FLIGHT_MAX.
FRONT_ANSWER_BYTES_IN_FLIGHT_MAX = 64 * MiB
# A connection that holds requests it cannot run (the bound above is reached)
# is aborted when no answer has gone out for this long: its client, or the
# clients holding the room, do not read.
CONNECTION_STALL_TIMEOUT_S = 60.0
# After SIGTERM, requests in flight get this long to finish before the logs close.
SHUTDOWN_GRACE_S = 5.0

# --- topics and the log ------------------------------------------------------

# Topic names: safe as a directory name on every filesystem ("." and ".." refused too).
TOPIC_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,249}")
# Kafka's limit: leaves room for ".../NNNN" directories under a 255-byte name limit.
TOPIC_NAME_BYTES_MAX = 249
# Topic names the client port remembers as valid, so a produce or fetch does not match the pattern
# again; past it the set starts over (a name is 249 bytes at most: about 1 MiB in all).
TOPIC_NAMES_REMEMBERED_MAX = 4096
# Partitions of a topic created without saying (DESIGN.md).
TOPIC_PARTITIONS_DEFAULT = 8
# Partitions of one topic: each is a directory with open files on every replica.
TOPIC_PARTITIONS_MAX = 1_024
# Topics on one cluster: the catalogue rides on gossip, so it must stay small.
TOPICS_MAX = 10_000

# Segments roll at this size. Big enough for sequential I/O, small enough that
# retention (which deletes whole segments) is not too coarse.
SEGMENT_BYTES_DEFAULT = 64 * MiB
# Smallest allowed segment (tests use small segments to exercise rolling).
SEGMENT_BYTES_MIN = 1 * KiB
# Largest allowed segment: recovery re-reads the tail segment, so bound it.
SEGMENT_BYTES_MAX = 1024 * MiB
# One sparse index entry per this many bytes of log: a lookup scans at most this.
INDEX_INTERVAL_BYTES = 4 * KiB

# Records older than this are deleted (whole segments): a week, as Kafka.
RETENTION_MS_DEFAULT = 7 * 24 * 3600 * 1000
# Bytes kept per partition; -1: no size limit unless a topic asks for one.
RETENTION_BYTES_DEFAULT = -1

# fsync policy "interval" with no number given: at most a second of writes at risk on power loss.
FSYNC_INTERVAL_MS_DEFAULT = 1_000
# Under the interval policy, a partition's log with this many bytes appended since
# its writeback last started has the kernel start writing them to disk (in a thread;
# not durable until the interval's fsync). An fsync that found a second's worth of
# writes in the page cache held up the appends beside it for tens of milliseconds;
# started this early, it finds little left. RocksDB's bytes_per_sync does the same.
WRITEBACK_START_BYTES = 1 * MiB
# How often the logs are checked for WRITEBACK_START_BYTES of new bytes.
WRITEBACK_CHECK_INTERVAL_MS = 100
# How often a partition's leader applies retention (ring serve --retention-interval-s):
# deleting whole segments is not urgent. Followers never apply it: they follow the
# leader's log start offset.
RETENTION_CHECK_INTERVAL_MS = 30_000

# --- gossip ------------------------------------------------------------------

# Brokers in one cluster. Every gossip digest lists every broker, so a round's
# bytes grow with this; large Cassandra clusters stay around a thousand nodes.
BROKERS_MAX = 1_024
# A broker name or address: a DNS name is at most 253 bytes.
BROKER_NAME_BYTES_MAX = 253
# Topic catalogue entries gossiped: every live topic plus a tombstone per deleted one.
GOSSIP_TOPIC_ENTRIES_MAX = 2 * TOPICS_MAX
# Nesting of a gossiped free-form value (load, extra, topic config): summaries, not documents.
GOSSIP_VALUE_DEPTH_MAX = 8
# Keys of one gossiped map or items of one list: bounds the work of checking a peer's message.
GOSSIP_MAP_KEYS_MAX = 256
# One string inside a gossiped value: addresses, codec names, short notes.
GOSSIP_STRING_BYTES_MAX = 4 * KiB
# One gossip message on the wire: a full state of BROKERS_MAX endpoints and
# GOSSIP_TOPIC_ENTRIES_MAX catalogue entries of a few hundred bytes each fits.
GOSSIP_MESSAGE_BYTES_MAX = 16 * MiB

# --- clocks (ring.gossip.clocks) ---------------------------------------------

# A broker whose wall clock is further than this from most of its peers' (ring
# serve --max-clock-offset) stops leading partitions, stamping records and
# applying time-based retention until it is back within it. Record timestamps
# and retention are read in seconds to days: two seconds is far beyond what NTP
# leaves (milliseconds) and far below what would move a retention decision.
CLOCK_OFFSET_MS_MAX_DEFAULT = 2_000
# Beyond this fraction of the hard bound, in percent, a broker warns (log,
# status, metrics, ring cluster status, the admin page) and goes on.
CLOCK_OFFSET_WARN_PERCENT = 50
# A gossip round trip longer than this measures a peer's clock too loosely
# (+- half of it) and is not used: a healthy loopback or LAN exchange takes
# milliseconds, a busy broker a few hundred.
CLOCK_SAMPLE_RTT_MS_MAX = 1_000
# A peer's latest clock measurement counts this long: gossip measures every
# peer of a small cluster every few seconds, and a broker missing a fresh one
# for a peer it needs starts an exchange with that peer.
CLOCK_SAMPLE_TTL_S = 30.0


# --- cluster and replication -------------------------------------------------

# A produce waits this long for the replicas its consistency level needs;
# then the answer is 504 "outcome unknown" (the batch may still commit).
# Five gossip rounds: a follower slower than this is as good as down.
REPLICATION_ACK_TIMEOUT_MS = 5_000
# Longest wait a produce may ask for (timeout_ms, Kafka's request.timeout.ms):
# the default one, which a forwarding broker's and a client's own deadlines sit above.
PRODUCE_TIMEOUT_MS_MAX = REPLICATION_ACK_TIMEOUT_MS
# Bytes sent to one follower and not yet acknowledged, over all partitions.
# Pipelining without a bound lets a slow follower fill the leader's memory;
# 8 MiB keeps a loopback or LAN link busy for several round trips.
REPLICATION_INFLIGHT_BYTES_MAX = 8 * MiB
# Stored batches read for one append frame (at least one whole batch is sent):
# big enough to amortise the frame, small enough to interleave partitions.
REPLICATION_FRAME_BYTES_MAX = 1 * MiB
# While an append frame to a follower is unanswered, fewer new records than this for that
# partition wait and leave together in the next frame, once the answer comes (as Nagle's
# algorithm holds what is less than a full segment): one frame per request when requests come
# one at a time, ever fewer per request as more come at once, so replication's cost per request
# falls as the load rises. About a frame's worth of 1 KiB records: batched produces of 100 are
# held too (at 32 of them in flight, 4% more throughput and a lower p99 than sending each at
# once); a produce of this many records or more is sent at once, pipelined.
REPLICATION_FRAME_HOLD_RECORDS_MAX = 1000
# One replication message on the websocket: a frame of batches plus a batch
# that did not fit, plus the frame's own few fields.
REPLICATION_MESSAGE_BYTES_MAX = REPLICATION_FRAME_BYTES_MAX + BATCH_BYTES_MAX + 64 * KiB
# A leader asks a follower that does not know a partition yet (the topic has
# not reached it by gossip) again after this long.
REPLICATION_PROBE_RETRY_MS = 300
# First reconnect delay to a follower after its link broke; doubles per failure.
REPLICATION_RECONNECT_MS_MIN = 100
# Longest reconnect delay: a restarted follower is caught up within a couple of seconds.
REPLICATION_RECONNECT_MS_MAX = 2_000
# Websocket ping interval on replication links (both ends): a link whose other end
# stopped (SIGSTOP) or went dark (a cut) is closed after this and half of it again
# without a pong, which frees a follower's in-flight bytes and tells a follower its
# leader may be gone (LINK_LOSS_GRACE_MS).
REPLICATION_HEARTBEAT_S = 2.0
# A follower whose leader's replication link has been closed this long counts the
# leader as lost (its elections start), without waiting for gossip to convict it; a
# leader whose links to a majority of a partition's voters have been closed this long
# refuses produces that need them (503 at once, not a 504 after the ack timeout). A
# link that broke by accident is open again within REPLICATION_RECONNECT_MS_MIN; one
# its leader closed on purpose (it leads nothing the follower replicates) loses nothing.
LINK_LOSS_GRACE_MS = 1_000
# One gossip exchange (syn, ack, ack2) with a peer: under two gossip rounds, so
# a stuck peer never holds more than one exchange of ours.
GOSSIP_REQUEST_TIMEOUT_S = 1.5
# Creating a topic waits this long for every live broker to learn it by a
# direct exchange, so a produce to any broker right after the 201 finds it.
CLUSTER_ANNOUNCE_TIMEOUT_S = 2.0
# A forwarded produce or a proxied read: the leader's own ack wait plus room
# for the network and its queue.
PEER_REQUEST_TIMEOUT_S = REPLICATION_ACK_TIMEOUT_MS / 1000 + 5.0
# Connections one broker keeps open to its peers (gossip, forwards, proxies).
PEER_CONNECTIONS_MAX = 64
# Each broker saves the high watermarks of its replicas this often (in an executor
# thread: the file's fsyncs take milliseconds, too long for the event loop), so a
# restarted replica serves what was committed before without waiting for peers.
HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS = 5_000


# --- failover, repair and membership changes ----------------------------------

# The election loop looks at every replica this often: a lost leader is
# noticed within a tick of gossip convicting it.
ELECTION_TICK_MS = 100
# Replicas stand in preference order: each one behind the first live,
# caught-up replica waits this much longer, so the natural order wins races.
ELECTION_RANK_STEP_MS = 1_500
# A candidacy that won no majority is retried after this long (doubling up to
# ELECTION_RETRY_MS_MAX), so two candidates do not keep splitting the votes.
ELECTION_RETRY_MS = 400
# Longest wait between two candidacies of one replica.
ELECTION_RETRY_MS_MAX = 3_000
# A replica back from an unclean shutdown that has not caught up stands only
# this long after the caught-up ones had their turn: when none of them can win
# (all behind it, or a whole cluster that crashed), someone still must; never a
# replica cut below what it acknowledged (repair, damage found by recovery).
ELECTION_UNCLEAN_FALLBACK_MS = 5_000
# One vote request to one peer: well under a gossip round, so a stalled voter
# does not hold a candidacy that already has its majority elsewhere.
VOTE_REQUEST_TIMEOUT_S = 1.0
# Vote requests (and their answers) to one peer travel together, this many to a message: a
# broker that lost a leader of a thousand partitions asks each voter in a few messages, not
# in a thousand, and a voter saves one message's ballots (an fsync each) in well under
# VOTE_REQUEST_TIMEOUT_S.
VOTES_PER_MESSAGE_MAX = 64
# A data directory's incarnation id as a vote, a sync or an ack carries it: ring makes 16 hex
# digits (ring.log.datadir); the room above that is for ids an operator or a later release sets.
INCARNATION_CHARS_MAX = 64
# Candidacies one broker runs at once; the replicas whose turn to stand comes beyond it wait in
# order and stand as candidacies end, without a retry's back-off. A round's requests to a peer then fit
# in two messages, answered within VOTE_REQUEST_TIMEOUT_S even when a thousand partitions lost
# their leader together (unbounded, a broker standing for 500 partitions at once sends its
# voter eight messages of saves to work through, and wins none of them within a minute).
CANDIDACIES_MAX = 2 * VOTES_PER_MESSAGE_MAX
# A leader that stopped claiming its partition in gossip (it stepped down, or
# restarted and leads nothing) is given up after this long; three gossip
# rounds also cover a new leader whose claim has not arrived yet.
LEADER_CLAIM_GRACE_MS = 3_000
# A replica placed elsewhere that still counts itself a voter closes once a leader it does not follow
# has claimed the partition this long: longer than the failure detector takes to call a dead broker
# down (4-13 s), so the claim of a leader that died before it relinked to a voter just restarted is
# known stale first (else the voter closes, and with another voter's disk lost, no majority is left).
UNPLACED_VOTER_GRACE_MS = 15_000
# A produce that finds no leader (an election is running) waits this long
# for one before the 503; a failover itself takes the failure detector's 4-13 s.
LEADER_WAIT_MS = 3_000
# A leader keeps a partition at least this long before handing it back to
# its natural leader, so leadership does not flap while a broker settles.
HANDOFF_MIN_LEAD_MS = 3_000
# Handing over, the leader stops appending and waits this long for the new
# leader to hold its whole log; if it does not, the leader goes on leading.
HANDOFF_CATCHUP_MS = 2_000
# After a handover that did not happen, the next try waits this long.
HANDOFF_RETRY_MS = 10_000
# Members one `ring serve --members` runs on a host: one per core of the largest common servers; each
# member holds its own ports, data directory and gossip entry.
MEMBERS_PER_HOST_MAX = 256
# A member that exits on its own is started again after this long, doubling on each exit within
# MEMBER_RESTART_RESET_S of its start up to MEMBER_RESTART_MS_MAX (a member that cannot start does
# not spin).
MEMBER_RESTART_MS = 1_000
MEMBER_RESTART_MS_MAX = 30_000
MEMBER_RESTART_RESET_S = 60.0
# A broker told to stop (SIGTERM) first hands every partition it leads to a caught-up follower, as
# Kafka's controlled shutdown does, so a rolling restart pauses a partition for one hand-off (about
# an election round) instead of a failure detection (4-13 s). A hand-off takes at most
# HANDOFF_CATCHUP_MS and is retried at once while stopping; past this the broker stops anyway and
# what it still leads fails over as after a crash.
STOP_HANDOVER_MS_MAX = 10_000
# Leader-epoch history entries sent in a sync frame: years of failovers; an
# older follower epoch than these is treated as sharing nothing (refetched).
LEADER_EPOCHS_SENT_MAX = 1_000
# A broker down this long is taken off the ring and its partitions get new
# replicas (ring serve --down-grace-s); Cassandra needs an operator for this.
DOWN_GRACE_S_DEFAULT = 300.0
# Anti-entropy compares each replica's committed segments with its leader's
# this often (ring serve --repair-interval-s); reading every byte is not free.
REPAIR_INTERVAL_S_DEFAULT = 60.0
# Checksummed ranges (segments) one comparison covers: the newest ones first.
REPAIR_RANGES_MAX = 4_096
# Bytes read per checksum step: the loop yields to requests between steps.
REPAIR_CHUNK_BYTES = 1 * MiB
# A remembered range digest is trusted this many rounds; then the range is read
# whole again, so damage on disk under a remembered digest is found by then
# (at the default interval, every ten minutes) without every round re-reading
# every committed byte.
REPAIR_REREAD_ROUNDS = 10

# --- ranges (ring.ranges) ------------------------------------------------------

# Holders of one range: a topic's replication factor is at most this (catalog.REPLICATION_FACTOR_MAX).
RANGE_COPIES_MAX = 7
# Ranges one partition's catalogue lists: 4 TiB of one partition in 64 MiB
# segments; the catalogue (about 120 bytes a range) travels whole to every replica.
RANGES_PER_PARTITION_MAX = 65_536
# How often a partition's leader cuts new ranges, orders copies, hands its
# catalogue to the replicas and trims their local tails (ring serve --range-interval-s).
RANGE_INTERVAL_S_DEFAULT = 1.0
# A leader hands an unchanged catalogue to its replicas again this often, so a
# replica that missed a change, or restarted, has it again within this.
RANGE_CATALOGUE_RESEND_S = 10.0
# Copies of ranges one broker orders at once (as leader of its partitions):
# each moves up to a segment's bytes between two brokers.
RANGE_COPIES_IN_FLIGHT_MAX = 4
# Copy orders waiting for one of those slots; more wait for a later round.
RANGE_COPY_ORDERS_MAX = 16
# New ranges a leader cuts per partition per round: each is read whole for
# its checksum, so a long backlog turned into ranges does not stall a round.
RANGES_CUT_PER_ROUND_MAX = 4
# A follower whose log starts past the ranges it knows of asks its leader for
# the catalogue at most this often (its reads go to the leader meanwhile).
RANGE_CATALOGUE_PULL_S_MIN = 1.0
# One copy of a range of B bytes may take RANGE_COPY_TIMEOUT_S_MIN plus B at
# RANGE_COPY_BYTES_PER_S_MIN (a 64 MiB range 37 s): a stuck holder or source
# does not hold a copy slot for long, and a slow disk still finishes.
RANGE_COPY_TIMEOUT_S_MIN = 30.0
RANGE_COPY_BYTES_PER_S_MIN = 10 * MiB  # the slowest copy a range is given time for
# A source that sends nothing for this long ends the pull (the next source is tried).
RANGE_COPY_READ_TIMEOUT_S = 15.0
# A replica that does not answer the catalogue exchange in this long is asked
# again in a later round: the leader's round goes on meanwhile.
RANGE_EXCHANGE_TIMEOUT_S = 5.0
# Bytes a range is read and sent in (copies, checksums, scrubs): the event loop
# serves requests between two chunks.
RANGE_CHUNK_BYTES = 1 * MiB
# A broker with less free disk than this takes no new range and says so in
# gossip, so placement passes it over (ring serve --disk-free-min-bytes): its
# disk stays for the appends of the partitions it holds.
DISK_FREE_BYTES_MIN_DEFAULT = 1024 * MiB

# --- consumer groups (ring.groups) -------------------------------------------

# Partitions of the internal offsets topic: each is one coordinator's shard of
# the groups, so this many brokers at most share the coordinating work
# (Kafka uses 50; a ring cluster is small and each partition is a directory on RF brokers).
OFFSETS_TOPIC_PARTITIONS = 8
# Replicas of each offsets partition (capped at the ring size, like any topic):
# committed offsets survive the loss of any one broker, and with consistency
# quorum commits go on while one is down.
OFFSETS_TOPIC_REPLICATION_FACTOR = 3
# Segments of the offsets topic: small, so retention frees space soon after
# checkpoints made older records useless.
OFFSETS_TOPIC_SEGMENT_BYTES = 16 * MiB
# Offsets records are kept this long (whole segments); checkpoints are far more
# frequent, so the latest checkpoint is never deleted. Kafka keeps offsets 7 days.
OFFSETS_TOPIC_RETENTION_MS = 7 * 24 * 3600 * 1000
# A group that has had no member and no commit for this long is left out of the
# next checkpoint and so forgotten (Kafka's offsets.retention.minutes).
GROUP_OFFSETS_RETENTION_MS = 7 * 24 * 3600 * 1000
# A coordinator writes a checkpoint of its groups after this many records ...
# so a new coordinator replays at most this many records past the checkpoint.
GROUP_CHECKPOINT_RECORDS = 10_000
# ... or after this long, whichever comes first: well under the retention above.
GROUP_CHECKPOINT_INTERVAL_MS = 24 * 3600 * 1000
# Groups one offsets partition holds: all live in the coordinator's memory and
# in every checkpoint.
GROUPS_PER_PARTITION_MAX = 10_000
# Members of one group: the assignment is recomputed for all of them on every
# join or leave, and every member is in each membership record.
GROUP_MEMBERS_MAX = 256
# Topics one member subscribes to: bounds a membership record and an assignment.
GROUP_MEMBER_TOPICS_MAX = 64
# Group names and consumer ids: path segments and record keys, so the topic-name
# alphabet, and short enough to log.
GROUP_NAME_PATTERN = re.compile(r"[A-Za-z0-9._:@-]{1,249}")
# A member that sends no request for this long leaves the group (a rebalance);
# any request counts, and a poll in progress keeps it alive. Kafka's default is 45 s;
# ring's polls are the heartbeat, so a shorter wait finds dead consumers sooner.
GROUP_SESSION_TIMEOUT_MS_DEFAULT = 10_000
# Shortest and longest session timeout a member may ask for: shorter than a
# second convicts consumers that merely paused for garbage collection; longer
# than five minutes leaves partitions unread for too long after a crash.
GROUP_SESSION_TIMEOUT_MS_MIN = 1_000
GROUP_SESSION_TIMEOUT_MS_MAX = 300_000
# How often a coordinator looks for expired members, changed partition counts
# and due checkpoints: a fraction of the shortest session timeout.
GROUP_TICK_MS = 250
# Partitions one group poll long-polls at once when none has records; each
# holds one of the broker's LONG_POLLS_OPEN_MAX slots while it waits.
GROUP_POLL_WAIT_PARTITIONS_MAX = 32
# Poll answers of one member that read one partition, remembered until the
# client acknowledges one (names its token, or polls again on the connection
# that carried it). More than one is out when a client polls through several
# connections or retries; past this the oldest is forgotten for that partition
# and its records there are handed out again. Per partition, not per member:
# a PolarStreams consumer has an answer out on every broker it polls.
GROUP_POLL_ANSWERS_UNACKED_MAX = 8
# PolarStreams consumers (consumer id -> group) each broker remembers; the
# least recently used are forgotten first and must register again (409).
POLAR_CONSUMERS_MAX = 10_000
# A PolarStreams consumer's session: its group drops it, and brokers forget
# its id, after this long without a request. PolarStreams' consumer read
# timeout is two minutes, and its clients are written for that.
POLAR_SESSION_TIMEOUT_MS = 120_000
# A consumer group of a topic whose partitions are "auto" has had more members
# than partitions for this long before the topic grows (one partition per
# waiting member): joins and leaves in a rolling restart do not grow it.
AUTO_PARTITIONS_GRACE_MS = 60_000
# Partitions of a topic created with "partitions": "auto": it grows to one per
# consumer of the largest group reading it.
AUTO_PARTITIONS_INITIAL = 1

# --- idempotent producers (ring.replication.idempotence) ---------------------

# Batches remembered per producer id and partition, for answering a retry with
# the original offsets: Kafka's max.in.flight.requests for idempotence is 5.
PRODUCER_BATCHES_KEPT = 5
# Producer ids remembered per partition; beyond it the least recently used is
# forgotten, and a retry of its batches is no longer recognised. Bounds the
# table's memory: a few hundred bytes per id.
PRODUCER_IDS_PER_PARTITION_MAX = 1_000
# A leader that has no producer table for a partition (after a restart or a
# failover) rebuilds it from the batch headers written in this window, newest
# last, counted back from the log's newest record or the wall clock, whichever
# is earlier (a clock stepped forward leaves out nothing recent); retries come
# within a client's delivery timeout (2 min), so an hour is ample and keeps the
# scan of a busy partition short.
PRODUCER_STATE_WINDOW_MS = 3_600_000
# Bytes of stored batches read per step of that rebuild; the loop yields between
# steps so other partitions are served meanwhile.
PRODUCER_STATE_SCAN_BYTES = 4 * MiB

# --- the admin page's charts (ring.http_api.trends) ---------------------------

# A broker samples its traffic and its groups' lag this often for the admin
# page's charts: the page refreshes every 2 s, a chart point every 5 s is
# smooth enough and shows a new producer within one point.
TRENDS_INTERVAL_MS = 5_000
# Samples kept: ten minutes at TRENDS_INTERVAL_MS, the "last minutes" a person
# looks at first; Prometheus (GET /metrics) keeps anything longer.
TRENDS_SAMPLES_MAX = 120
# Topics in one sample, the busiest first (quiet ones take no room): bounds a
# sample's bytes however many topics the cluster holds.
TRENDS_TOPICS_MAX = 64
# Consumer groups in one sample, the most behind first.
TRENDS_GROUPS_MAX = 64


# --- Spark (sparkio) ---------------------------------------------------------

# How long a Spark task waits for offsets the planner saw below the high
# watermark but a replica does not serve yet (a follower catching up after a
# failover). Kafka's connector waits 2 min; a task that cannot read committed
# data for this long fails and Spark retries it.
SPARK_POLL_TIMEOUT_MS_DEFAULT = 120_000
# One HTTP request from a Spark task or the planner: connect plus answer. A
# fetch never long-polls past committed data, so 30 s means a stuck broker.
SPARK_REQUEST_TIMEOUT_S = 30.0
# How long a request keeps going round the brokers before it is given up: a
# partition's failover (conviction 5-13 s, then an election) or a broker's
# restart fits several times over, as for the Python client
# (CLIENT_RETRY_TIMEOUT_S_DEFAULT); then the task fails and Spark retries it.
SPARK_FAILOVER_S = 60.0
# Pause between rounds over all brokers, doubled each round (0.4, 0.8, 1.6 ...)
# up to the cap.
SPARK_FAILOVER_BACKOFF_MS = 400
SPARK_FAILOVER_BACKOFF_MS_MAX = 2_000
# Records a Spark writer task buffers per produce request: well under
# RECORDS_PER_REQUEST_MAX so a retry resends little.
SPARK_WRITE_RECORDS_PER_REQUEST_MAX = 5_000
# Bytes a Spark writer task buffers per produce request: a quarter of
# REQUEST_BYTES_MAX, leaving room for msgpack framing and retries in flight.
SPARK_WRITE_BYTES_PER_REQUEST_MAX = 4 * MiB


# --- client (ring.client) ----------------------------------------------------

# How long a producer holds a partition's open batch for more records before
# sending it: Kafka's linger.ms. 5 ms costs little latency and lets a busy
# producer send a few large requests instead of many small ones.
CLIENT_LINGER_MS_DEFAULT = 5
# A producer batch is sent once it holds this many bytes of records, linger or
# not: Kafka's batch.size, larger because every request is an HTTP round trip.
CLIENT_BATCH_BYTES_DEFAULT = 512 * KiB
# Largest batch a producer may be configured to build: a batch stays under the
# broker's BATCH_BYTES_MAX with room for one maximal record's framing.
CLIENT_BATCH_BYTES_MAX = MESSAGE_BYTES_MAX
# One produce request carries every ready batch of one partition up to this:
# a quarter of REQUEST_BYTES_MAX so a retry resends little and one slow
# request does not hold much of the buffer.
CLIENT_REQUEST_BYTES_MAX = 4 * MiB
# Records in one produce request, well under RECORDS_PER_REQUEST_MAX.
CLIENT_REQUEST_RECORDS_MAX = 20_000
# Bytes of records a producer buffers (queued or in flight) before produce()
# refuses more (Kafka's buffer.memory): bounds a client's memory when brokers
# are slower than the application.
CLIENT_BUFFER_BYTES_DEFAULT = 32 * MiB
# How long a produce waits for room in a full buffer before raising BufferFull
# (Kafka's max.block.ms): long enough to ride out a failover.
CLIENT_MAX_BLOCK_MS_DEFAULT = 60_000
# Produce requests in flight at once per client (at most one per partition,
# which keeps each partition's records in order across retries).
CLIENT_IN_FLIGHT_REQUESTS_DEFAULT = 64
# One request's answer, replication included: above REPLICATION's ack wait so
# a broker's own 504 arrives before the client gives up.
CLIENT_REQUEST_TIMEOUT_S_DEFAULT = 30.0
# An idempotent producer's request that has had no answer this long after it was
# sent is given up and sent again, exactly as it was, through another broker: a
# stopped leader (SIGSTOP) keeps its connections open and would hold it for the
# whole request timeout. Above REPLICATION's ack wait, so a live broker's own
# 504 comes first.
CLIENT_PRODUCE_ANSWER_TIMEOUT_S = REPLICATION_ACK_TIMEOUT_MS / 1000 + 1.0
# Opening a TCP connection to a broker: loopback or LAN; longer means it is down.
CLIENT_CONNECT_TIMEOUT_S = 3.0
# How long a fetch, an administrative call or a group consumer's request is
# tried again (backing off, on other brokers) before BrokersUnavailable: Kafka's
# default.api.timeout.ms. A failover takes conviction (5-13 s), an election and
# a new coordinator loading its groups, or a broker's restart: all of it fits
# several times over, and an outage longer than a minute is the application's
# to hear of. Produce requests retry until the delivery timeout instead.
CLIENT_RETRY_TIMEOUT_S_DEFAULT = 60.0
# Rebalances one group poll follows in a row (a rejoin each) before it raises
# Conflict: a group whose membership keeps changing faster than it can poll.
CLIENT_POLL_REJOINS_MAX = 8
# First pause before a retry, doubled per attempt up to the cap below: long
# enough for gossip to spread a changed status, short enough to ride a restart.
CLIENT_RETRY_BACKOFF_MS = 50
CLIENT_RETRY_BACKOFF_MS_MAX = 2_000
# A record not acknowledged within this after produce() fails (Kafka's
# delivery.timeout.ms): well beyond a failover (conviction takes 5-13 s, then
# an election), so a leader's crash costs no record.
CLIENT_DELIVERY_TIMEOUT_S_DEFAULT = 120.0
# A group consumer's lag (high watermark minus position, in its stats) is
# refreshed by a poll at most this often: two small requests per refresh.
CLIENT_CONSUMER_LAG_REFRESH_MS = 5_000
# Cached topology is refreshed after this even when nothing failed, so new
# brokers and moved leaders are learned (Kafka's metadata.max.age.ms is 5 min).
CLIENT_METADATA_MAX_AGE_MS = 30_000
# At most one topology refresh per this interval: failing requests must not
# turn into a storm of metadata requests.
CLIENT_METADATA_REFRESH_MS_MIN = 100
# Open connections in a client's pool, across all brokers.
CLIENT_CONNECTIONS_MAX = 128
# After create_topic, how long the client waits for every live broker to know
# the topic (the catalogue spreads by gossip) and a leader for each of its
# partitions (an election on a busy cluster may take a few seconds).
CLIENT_TOPIC_PROPAGATION_S_MAX = 10.0

# How long the client trusts a partition's list of ranges (where it reads
# offsets below the replicas' local tails): ranges move only when brokers
# join or leave, and a holder that lost one proxies the read anyway.
CLIENT_RANGES_MAX_AGE_MS = 10_000

# --- security and abuse (ring.auth, ring.tls, ring.http_api.server) ---------

# Tokens in one --auth-tokens file: every request's token is compared with all
# of them (constant time, no early exit), so the count bounds that work.
AUTH_TOKENS_MAX = 10_000
# The identity one broker passes to another with a forwarded request
# (Ring-Principal, JSON of the token's name and grants): under one header line.
PRINCIPAL_HEADER_BYTES_MAX = 4 * KiB
# Connections one client port holds open at once; the next is answered 503 and
# closed. Each costs a file descriptor, buffers and a handler: a client that
# opens thousands (idle, or each long-polling) cannot take the broker's memory
# or its descriptors (a default ulimit is 1024-65536). Brokers talk to each
# other on the peer port, which has its own bound below.
CLIENT_CONNECTIONS_OPEN_MAX = 2_000
# Connections the peer port holds open: every other broker's gossip, forwards,
# proxies and replication links, PEER_CONNECTIONS_MAX from each of BROKERS_MAX
# would be far more than a real cluster; a few hundred brokers' worth.
PEER_CONNECTIONS_OPEN_MAX = 4_000
# A TLS client must finish its handshake within this: a handshake that never
# ends is slowloris one layer down, holding a socket before any header arrives.
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# A response must be taken by the client within this once it is ready: a
# client that never reads its fetch answer holds the answer's bytes (up to
# FETCH_BYTES_MAX) and a connection; then the connection is closed. Longer
# than the longest long-poll so a slow but live link still gets its answer.
RESPONSE_SEND_TIMEOUT_S = 60.0
# Bytes of request bodies one broker holds at once, counted as they arrive (after
# Content-Encoding is undone) and given back when the request ends: a piece that
# does not fit, or a declared Content-Length that does not fit now, is answered
# 429 with Retry-After. Without it CLIENT_CONNECTIONS_OPEN_MAX 16 MiB uploads would
# hold 32 GiB; counted by arrival, a client that declares a size and trickles
# holds only what it sent.
REQUEST_BODY_BYTES_IN_FLIGHT_MAX = 256 * MiB
# Produces a broker forwards to leaders at once (each holds its batches until
# the leader answers, up to PEER_REQUEST_TIMEOUT_S); beyond it 429 with
# Retry-After, so a stalled leader cannot make every other broker pile up
# requests for it.
FORWARDS_IN_FLIGHT_MAX = 512
# A leader whose peer port refused the forward link (an older release) is sent
# forwarded produces over HTTP for this long before the link is tried again:
# short enough that an upgraded leader gets the link soon, long enough that an
# old one costs one refused handshake now and then, not one per produce.
FORWARD_LINK_RETRY_S = 30.0
# Bytes of fetch answers one broker holds at once, from the read (its disk, or
# a replica it proxies) until the last byte is handed to the socket. A client
# that asks for FETCH_BYTES_MAX and reads slowly, or never, holds its answer
# up to RESPONSE_SEND_TIMEOUT_S: CLIENT_CONNECTIONS_OPEN_MAX of them would hold
# 32 GiB. Beyond it a fetch reads less, or gets 429 with Retry-After when no
# room is left; four maximal answers fit, and consumers reading at full speed
# (a few answers of a few MiB at once) stay far below it.
FETCH_ANSWER_BYTES_IN_FLIGHT_MAX = 64 * MiB
# Piece of an answer handed to the socket at a time: the writer waits for the
# transport to drain after each, so the transport never queues a whole answer.
ANSWER_WRITE_CHUNK_BYTES = 256 * KiB
# Stored bytes one group poll reads across all the member's partitions (each
# partition also at most FETCH_BYTES_DEFAULT): a poll's records, and its
# answer, stay about this size however many partitions a member holds, where
# one read per partition made a member of 10 partitions hold 10 MiB a poll.
GROUP_POLL_BYTES_MAX = 1 * MiB
# The same for a poll answered with stored batches (application/vnd.ring.poll-
# batches): its answer is the bytes read, as a fetch's is, with no record
# decoded, so it may read what four partitions' default fetches would; a larger
# answer spreads a poll's own costs (its commit, a relay) over more records.
GROUP_POLL_BATCHES_BYTES_MAX = 4 * MiB
# Long-poll a broker asks of the replica it reads through (a partition it does
# not hold, or an offset its lagging copy has not heard of): half of
# PEER_REQUEST_TIMEOUT_S, so the replica answers, empty if need be, before
# the peer request gives up and the consumer gets 503 for a plain long-poll.
PROXIED_FETCH_WAIT_MS_MAX = int(PEER_REQUEST_TIMEOUT_S * 1000) // 2


# Unclean elections a partition replica remembers winning (the offsets each may have lost, shown in
# GET /v1/topics/{topic}); older ones are dropped. Each is a few dozen bytes of replica-state.
UNCLEAN_HISTORY_MAX = 32
# How long an operator's unclean election waits for a leader before answering 503 (the replicas asked
# go on standing): a few election rounds (ELECTION_TICK_MS, VOTE_REQUEST_TIMEOUT_S each).
UNCLEAN_ELECTION_WAIT_S = 15.0

# --- admission and quotas ------------------------------------------------------

# How often the client port's front checks how late the event loop runs (one
# timer per listening socket, comparing when it ran with when it was due): a
# loop saturated for longer than this is seen, and refusing stops this soon
# after it catches up, well inside the second the issue of recovery allows.
LOOP_LAG_PROBE_INTERVAL_S = 0.05
# A new produce, fetch or group poll/commit is refused (429, Retry-After) while
# the loop was this late at each of the last LOOP_LAG_PROBES_LATE probes (and
# other such requests are running: late with none, it was busy with work
# already answered, and nothing queues behind it): every
# request it holds waits that long before a byte of it is handled. A healthy
# broker's loop is late by a few ms (a full GC pass of the unfrozen heap is
# ~25 ms); 100 ms, probe after probe, is only reached when work arrives faster
# than the loop can do it. ``ring serve --loop-lag-ms-max``.
LOOP_LAG_MS_MAX = 100
# Probes in a row that must all be late past LOOP_LAG_MS_MAX before new work is
# refused: one heavy request (a 16 MiB body decoded and appended) makes one
# probe late and must not turn away the requests behind it; a loop that stays
# behind for three probes (150 ms and more) is overloaded. One probe on time
# ends the refusals.
LOOP_LAG_PROBES_LATE = 3
# Produces, fetches and group polls/commits admitted and not answered yet (and
# the Kafka listener's produces), less the long-polls parked waiting for data
# (idle, not work), above which a new one is refused (429, Retry-After; the
# Kafka listener holds its frame instead). Little's law: a broker acking ~10k
# produces/s at quorum in ~20 ms runs ~200 at once; five times that is a queue
# whose requests wait longer than they run. ``ring serve --requests-running-max``.
REQUESTS_RUNNING_MAX = 1024
# The Kafka listener holds a Produce or Fetch frame, its connection unread, while
# the admission would refuse new work, and looks again this often: a few loop-lag
# probes' time, short beside a client's request.timeout.ms (30 s by default) and
# long enough that held connections cost the loop little.
KAFKA_ADMISSION_RECHECK_MS = 50
# A token's quota bucket holds this many seconds of its rate: a client may
# send a second's worth at once (as Kafka's quota windows of about a second
# allow) and is held to the rate over longer spans.
QUOTA_BURST_S = 1.0
# Longest Retry-After a throttled client is told, whatever its debt: a single
# maximal request against a small quota would otherwise be told hours; it is
# refused again, with the rest of the wait, when it comes back early.
QUOTA_WAIT_S_MAX = 30.0
# Per-token quota rates given in a tokens file must be below this: a typo of
# extra digits is an error, not silently no quota (1 TiB/s is no limit anyway).
QUOTA_RATE_MAX = 1 << 40


# --- the Kafka protocol listener (ring.kafka_api) ----------------------------

# One Kafka request as its 4-byte size prefix states it: a produce carries
# batches up to REQUEST_BYTES_MAX like an HTTP produce body, plus a header and
# topic names. A prefix above it closes the connection before a byte of the
# frame is held: a hostile length cannot make the broker reserve gigabytes.
KAFKA_REQUEST_BYTES_MAX = REQUEST_BYTES_MAX + 64 * KiB
# Requests of one Kafka connection read and not yet answered; at the bound the
# connection stops reading until answers leave. librdkafka pipelines up to a
# million by default, so without it one client's queue would be unbounded.
KAFKA_REQUESTS_IN_FLIGHT_MAX = 32
# Partitions one Kafka fetch may name: each costs a read and, while the fetch
# long-polls, a waiter; Kafka clients ask for the partitions they are assigned.
# ListOffsets and OffsetForLeaderEpoch are held to it too (a lookup and an
# answer each).
KAFKA_FETCH_PARTITIONS_MAX = 1_000
# Protocols (assignors) one JoinGroup may name: clients name the few they are
# configured with (librdkafka "range,roundrobin" by default), and every
# member's list is held by the coordinator for as long as it is a member.
KAFKA_GROUP_PROTOCOLS_MAX = 8
# A protocol's name, and its metadata (a consumer's subscription: its topics,
# user data and, for cooperative assignors, the partitions it owns): held per
# member and handed to the leader in one JoinGroup answer, so together with
# GROUP_MEMBERS_MAX they bound that answer and the group's memory.
KAFKA_GROUP_PROTOCOL_NAME_MAX = 64
KAFKA_GROUP_METADATA_BYTES_MAX = 16 * KiB
# All the assignments of one leader's SyncGroup together: held until the next
# rebalance, each handed to its member.
KAFKA_GROUP_ASSIGNMENT_BYTES_MAX = 1 * MiB
# The client id a generated member id starts with (Kafka's "client-id-UUID"):
# a client id is the client's to choose, a member id is kept and logged.
KAFKA_GROUP_CLIENT_ID_IN_MEMBER_ID_MAX = 64
# A member's rebalance timeout (its max.poll.interval.ms, 5 minutes by default)
# is taken up to this: a rebalance waits that long for members to join again,
# and heartbeats keep a member that never does in the group meanwhile.
KAFKA_GROUP_REBALANCE_TIMEOUT_MS_MAX = 30 * 60 * 1000
# Group ids one FindCoordinator (v4) asks about: each is a lookup of the
# group's offsets partition's leader; a consumer asks for its one group, an
# admin client for a few. The ids past it are answered INVALID_REQUEST.
KAFKA_FIND_COORDINATOR_KEYS_MAX = 64
# Group ids one DescribeGroups or DeleteGroups names: each is a look-up (and a
# delete a quorum write) at the coordinator, one after the other; an admin
# client names the groups of one coordinator. The ids past it are answered
# INVALID_REQUEST.
KAFKA_GROUPS_PER_REQUEST_MAX = 64
# Topics one CreateTopics or DeleteTopics names: each is a create or delete
# gossiped to the cluster, one after the other; a tool names a few. Those
# past it are answered INVALID_REQUEST.
KAFKA_TOPICS_PER_REQUEST_MAX = 64


def markdown_table() -> str:
    """The limits table of docs/LIMITS.md: every UPPER_CASE constant with its why-comment."""
    import ast
    import inspect
    import sys

    source = inspect.getsource(sys.modules[__name__])
    lines = source.splitlines()
    rows = ["| limit | value | why |", "|---|---|---|"]
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        name = getattr(node.targets[0], "id", "")
        if not name.isupper() or name in ("KiB", "MiB"):
            continue
        value = globals()[name]
        if isinstance(value, re.Pattern):
            value = value.pattern
        comment, i = [], node.lineno - 2
        while i >= 0 and lines[i].startswith("#"):
            comment.insert(0, lines[i].lstrip("# ").strip())
            i -= 1
        inline = lines[node.lineno - 1].partition("  # ")[2]
        why = " ".join(comment) or inline
        rows.append(f"| `{name}` | `{value}` | {why} |")
    return "\n".join(rows)


def validate() -> None:
    """Checked at start: the limits must be consistent with each other."""
    assert MESSAGE_BYTES_MAX <= REQUEST_BYTES_MAX
    assert MESSAGE_BYTES_MAX < BATCH_BYTES_MAX <= REQUEST_BYTES_MAX
    assert NDJSON_LINE_BYTES_MAX > MESSAGE_BYTES_MAX
    assert FETCH_BYTES_DEFAULT <= FETCH_BYTES_MAX
    assert GROUP_POLL_BYTES_MAX <= GROUP_POLL_BATCHES_BYTES_MAX <= FETCH_BYTES_MAX
    assert FETCH_RECORDS_DEFAULT <= FETCH_RECORDS_MAX
    assert SEGMENT_BYTES_MIN <= SEGMENT_BYTES_DEFAULT <= SEGMENT_BYTES_MAX
    assert TOPIC_PARTITIONS_DEFAULT <= TOPIC_PARTITIONS_MAX
    assert SPARK_WRITE_BYTES_PER_REQUEST_MAX <= REQUEST_BYTES_MAX - MESSAGE_BYTES_MAX
    assert SPARK_WRITE_RECORDS_PER_REQUEST_MAX <= RECORDS_PER_REQUEST_MAX
    assert REPLICATION_FRAME_BYTES_MAX + BATCH_BYTES_MAX < REPLICATION_MESSAGE_BYTES_MAX
    assert REPLICATION_RECONNECT_MS_MIN <= REPLICATION_RECONNECT_MS_MAX
    assert PEER_REQUEST_TIMEOUT_S * 1000 > REPLICATION_ACK_TIMEOUT_MS
    assert CLIENT_BATCH_BYTES_DEFAULT <= CLIENT_BATCH_BYTES_MAX < BATCH_BYTES_MAX
    assert CLIENT_BATCH_BYTES_MAX <= CLIENT_REQUEST_BYTES_MAX <= REQUEST_BYTES_MAX - BATCH_BYTES_MAX
    assert CLIENT_REQUEST_RECORDS_MAX <= RECORDS_PER_REQUEST_MAX
    assert CLIENT_RETRY_BACKOFF_MS <= CLIENT_RETRY_BACKOFF_MS_MAX
    assert RESPONSE_SEND_TIMEOUT_S * 1000 > LONG_POLL_WAIT_MS_MAX
    assert REQUEST_BODY_BYTES_IN_FLIGHT_MAX >= REQUEST_BYTES_MAX
    assert PRINCIPAL_HEADER_BYTES_MAX <= HEADER_LINE_BYTES_MAX < REQUEST_HEAD_BYTES_MAX
    assert FETCH_BYTES_MAX <= FETCH_ANSWER_BYTES_IN_FLIGHT_MAX
    assert CONNECTION_ANSWER_BYTES_MAX <= FRONT_ANSWER_BYTES_IN_FLIGHT_MAX
    assert CONNECTION_STALL_TIMEOUT_S * 1000 > LONG_POLL_WAIT_MS_MAX
    assert 0 < CLOCK_OFFSET_WARN_PERCENT <= 100
    assert CLOCK_SAMPLE_RTT_MS_MAX / 2 < CLOCK_OFFSET_MS_MAX_DEFAULT
    assert CLOCK_SAMPLE_RTT_MS_MAX < GOSSIP_REQUEST_TIMEOUT_S * 1000
    assert GROUP_SESSION_TIMEOUT_MS_MIN <= POLAR_SESSION_TIMEOUT_MS <= GROUP_SESSION_TIMEOUT_MS_MAX
    assert 0 < LOOP_LAG_PROBE_INTERVAL_S * 1000 < LOOP_LAG_MS_MAX
    assert 0 < KAFKA_ADMISSION_RECHECK_MS
    assert 0 < QUOTA_BURST_S <= QUOTA_WAIT_S_MAX and LOOP_LAG_PROBES_LATE >= 1
    assert KAFKA_REQUEST_BYTES_MAX > REQUEST_BYTES_MAX
    assert FETCH_RECORDS_MAX <= 0xFFFF  # a PolarStreams binary poll answer counts its items in a uint16


validate()


def connection_bytes_max(answer_bytes_max: int) -> int:
    """What one client connection can make the broker hold, answers whose largest is
    ``answer_bytes_max`` bytes: the answers built and not sent (CONNECTION_ANSWER_BYTES_MAX
    and the one that crossed it), the rest of one read, and the requests its pipeline
    holds and the one whose head is arriving, each head twice over (as read and as
    decoded strings). Bodies are held in REQUEST_BODY_BYTES_IN_FLIGHT_MAX."""
    return (CONNECTION_ANSWER_BYTES_MAX + answer_bytes_max + CONNECTION_UNPARSED_BYTES_MAX
            + (PIPELINED_REQUESTS_MAX + 1) * 2 * REQUEST_HEAD_BYTES_MAX)


def write_table(path: str) -> None:
    """Replace what lies between the ``limits`` markers of the Markdown file ``path`` with the table."""
    text = open(path, encoding="utf-8").read()
    start, end = "<!-- limits:start -->\n", "<!-- limits:end -->"
    head, found, rest = text.partition(start)
    assert found and end in rest, f"{path} has no {start.strip()} ... {end} markers"
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + start + markdown_table() + "\n" + end + rest.split(end, 1)[1])


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write_table(sys.argv[2])
    elif len(sys.argv) == 1:
        print(markdown_table())
    else:
        sys.exit("usage: python -m ring.limits [--write FILE.md]")
