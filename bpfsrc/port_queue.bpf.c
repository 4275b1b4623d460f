/* mrclab's linux data plane, congestion and loss half: a tc (clsact egress, direct action) program
 * on every switch port, the kernel twin of p4src/mrclab.p4's queue logic.
 *
 * Two programs. mrclab_un, on every switch port's ingress, is the switch's SRv6 uN SID (RFC 9800
 * NEXT-C-SID, 32-bit block, 16-bit uSIDs), as p4src/mrclab.p4's my_sid table is on bmv2: a packet
 * whose outer destination is the switch's own SID (block | own uSID, a /48, map un_sid) has its
 * uSID part shifted left by 16 bits, zeros in behind, and the kernel then forwards it on the new
 * destination by the static /48 routes the controller wrote (controller/kernel_routes.py); the
 * map counts the packets it shifted. The kernel's own SRv6 (seg6local End, flavour next-csid) did
 * this until 2026-12-04; kernels built without CONFIG_IPV6_SEG6_LWTUNNEL refuse it, and tc's
 * clsact and cls_bpf are on every kernel the lab runs on.
 *
 * mrclab_egress, on every switch port's egress where the switches queue, decides per packet
 * leaving a port what p4src/mrclab.p4's ingress and egress decide on bmv2:
 *
 *   gray loss   a per-port drop probability (threshold / 65536), drawn from a per-port linear
 *               congruential generator (Numerical Recipes constants) XORed with a salt, as
 *               mrclab.p4's gray_loss action does: a run repeats for a seed. Only MRC / RoCE
 *               packets draw (the kernel's own neighbour discovery would shift the sequence
 *               at random moments and a run would not repeat).
 *   priority    trimmed packets and control packets (every MRC opcode but WRITE / WRITE_IMM) go
 *               to the high-priority htb class 1:10, everything else to the low one 1:20.
 *   queue       a virtual queue per port counts the low-priority bytes queued, in units of a
 *               full data frame (frame_bytes; a packet of half a frame counts half), drained at
 *               the port's rate in full data frames per second (rate_pps, controller/queues.py):
 *               an eBPF program cannot read a qdisc's backlog, so it keeps its own ("phantom
 *               queue", HULL, NSDI 2012); the real queue behind it is htb at the same bit rate,
 *               which sends a small packet in its own bytes' time, so the count is of bytes
 *               (as a switch's buffer is). Counted in packets, 16 QPs writing 64-byte chunks
 *               (218-byte frames) read five times the queue htb held: ECN marks, trims and PFC
 *               pauses for a queue that was not there (fig. 16, RoCE 16 QPs at 8 KiB).
 *   trim        a data packet that finds trim_t or more packets queued is cut to its headers
 *               (TRIM_BYTES), its lengths rewritten, DSCP TRIM_DSCP, the BTH's TRIM flag set,
 *               and sent high priority. The kernel fixes a packet's length for the qdiscs before
 *               the egress hook runs: a packet cut here would still cost htb its full length, so
 *               a trimmed packet is sent again (bpf_redirect to its own port, skb->mark
 *               MARK_TRIMMED) and passes this hook a second time at its new length.
 *   drop        anything else low priority that finds q_limit or more queued is dropped, unless
 *               the port is lossless (PFC, the RoCE baseline's fabric): then nothing is dropped
 *               for a full queue; the pause agent (controller/pfc.py) keeps the queue short by
 *               pausing the ports that feed it.
 *   PFC         on a lossless port the program records which of the switch's ports fed the
 *               low-priority queue (pfc.feeds: bit port_no of the ingress port) for the pause
 *               agent, and the virtual queue does not drain while the agent holds the port paused
 *               (pfc.pause_start .. pause_end, written by the agent), as the real one behind it
 *               does not.
 *   ECN         an ECN-capable packet joining a queue holding ecn_k or more gets CE (the
 *               controller leaves ecn_k 0 on ports down to hosts).
 *   counters    marked, trimmed, dropped at a full queue and by gray loss, per port.
 *   schedule    the drain watch (experiments/analysis/fidelity.py, "ports behind their schedule"):
 *               when the last low-priority byte queued so far leaves if the port keeps its rate
 *               (sched_ns: the later of now and the last schedule, plus the packet's bytes at
 *               ps_per_byte), as p4src/mrclab.p4's q_sched keeps BMv2's. The port sampler compares
 *               it with the real queue's backlog (netlink): a real queue holding more than the
 *               schedule leaves in it drained slower than its rate (the kernel's forwarding fell
 *               behind). Not on lossless ports (their pauses stop the real drain on purpose).
 *   fifo        a port whose shaper is one FIFO (a host's NIC port, its tbf): every packet joins
 *               the schedule and nothing else is done to it (no priority, mark or trim), but for
 *               the queue's limit: a packet that would find more than q_limit bytes scheduled
 *               ahead of it is dropped here (counted queue_full; the sender's socket reads
 *               ENOBUFS, as from a full tbf), whose own limit is set deeper, so that the
 *               schedule counts exactly what the real queue took (a frame the tbf refused after
 *               the program scheduled it would stay in the schedule).
 *
 * Maps, keyed by the port's ifindex in the switch's namespace: port_cfg (written by the
 * controller, controller/bpf.py) and port_state (this program's: queue, generator, counters;
 * the controller reads it). Constants mirror p4src/mrclab.p4 and protocol/headers.py.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_LEN 14
#define OFF_OUTER 14
#define OFF_INNER (OFF_OUTER + 40)
#define OFF_UDP (OFF_INNER + 40)
#define OFF_BTH (OFF_UDP + 8)
#define PROTO_IPV6 41
#define PROTO_UDP 17
#define ROCE_UDP_PORT 4791
#define OP_WRITE 0xC6
#define OP_WRITE_IMM 0xC7
#define F_TRIM 0x02
#define TRIM_DSCP 0x2A
#define TRIM_BYTES 150
#define TRIM_OUTER_LEN 96
#define TRIM_INNER_LEN 56
#define CLASS_HIGH 0x00010010 /* htb 1:10 */
#define CLASS_LOW 0x00010020  /* htb 1:20 */
#define MARK_TRIMMED 0x6d72634bU /* skb->mark of a packet this program trimmed and sent again */
#define FP_SHIFT 20           /* the virtual queue counts full frames in 1/2^20 */
#define FP_ONE (1ULL << FP_SHIFT)

struct port_cfg {
	__u32 rate_pps;       /* virtual queue drain, full frames per second (0: never queues) */
	__u32 ecn_k;          /* mark at or above, packets (0: never) */
	__u32 trim_t;         /* trim data at or above, packets (0: never) */
	__u32 q_limit;        /* drop at or above, packets (0: never); a fifo port: bytes scheduled ahead */
	__u32 loss_threshold; /* gray loss: drop when draw < threshold, of 65536 (0: off) */
	__u32 salt;
	__u32 lossless;       /* PFC: the low-priority class is never dropped for a full queue */
	__u32 port_no;        /* this port's number on its switch (its bit in pfc.feeds) */
	__u32 frame_bytes;    /* a full data frame, the virtual queue's unit (0: count packets) */
	__u32 ps_per_byte;    /* the drain watch's schedule: a byte's time at the port's rate, ps (0: none) */
	__u32 fifo;           /* one FIFO (a host NIC port): schedule every packet, do nothing else */
};

struct port_state {
	struct bpf_spin_lock lock;
	__u32 lcg;     /* gray loss generator */
	__u64 last_ns; /* when the queue was last drained */
	__u64 occ;     /* low-priority bytes queued in full frames, fixed point (FP_SHIFT) */
	__u64 marked;
	__u64 trimmed;
	__u64 queue_full;
	__u64 gray;
	__u64 low;  /* packets sent low priority */
	__u64 high; /* packets sent high priority */
	__u64 sched_ns; /* the drain watch: when the low-priority bytes queued so far leave at the port's rate */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct port_cfg);
} port_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct port_state);
} port_state SEC(".maps");

/* PFC, per port: which ports fed its low-priority queue (this program ORs bits in; the agent reads
 * and clears them) and the last pause the agent held it in (bpf_ktime_get_ns times; pause_end 0:
 * still paused; pause_start 0: never paused). */
struct pfc_state {
	__u64 feeds;
	__u64 pause_start;
	__u64 pause_end;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct pfc_state);
} pfc SEC(".maps");

/* The switch's uN SID: the first 6 bytes of block | own uSID (the /48), and the packets shifted. */
struct un_sid {
	__u8 sid[8]; /* 6 used */
	__u64 packets;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct un_sid);
} un_sid SEC(".maps");

#define OFF_DST (OFF_OUTER + 24) /* the outer IPv6 destination */

SEC("tc")
int mrclab_un(struct __sk_buff *skb)
{
	__u8 dst[16];
	__u32 k = 0;
	if (skb->protocol != bpf_htons(0x86DD) || bpf_skb_load_bytes(skb, OFF_DST, dst, 16))
		return TC_ACT_OK;
	struct un_sid *s = bpf_map_lookup_elem(&un_sid, &k);
	if (!s || dst[0] != s->sid[0] || dst[1] != s->sid[1] || dst[2] != s->sid[2] || dst[3] != s->sid[3] ||
	    dst[4] != s->sid[4] || dst[5] != s->sid[5])
		return TC_ACT_OK; /* not this switch's SID: the kernel routes it as it is */
#pragma unroll
	for (int i = 4; i < 14; i++) /* the uSIDs after the block move up one; the block stays */
		dst[i] = dst[i + 2];
	dst[14] = 0;
	dst[15] = 0;
	if (bpf_skb_store_bytes(skb, OFF_DST + 4, dst + 4, 12, 0))
		return TC_ACT_SHOT;
	__sync_fetch_and_add(&s->packets, 1);
	return TC_ACT_OK;
}

enum verdict { V_LOW, V_HIGH, V_TRIM, V_DROP_FULL, V_DROP_GRAY };

static __always_inline int set_ce(struct __sk_buff *skb)
{
	__u8 b;
	if (bpf_skb_load_bytes(skb, OFF_OUTER + 1, &b, 1))
		return 0;
	b |= 0x30; /* traffic class bits 1:0 = 11 (CE), RFC 3168 */
	return bpf_skb_store_bytes(skb, OFF_OUTER + 1, &b, 1, 0) == 0;
}

static __always_inline int trim(struct __sk_buff *skb)
{
	__u8 tc[2];
	__u16 outer = bpf_htons(TRIM_OUTER_LEN), inner = bpf_htons(TRIM_INNER_LEN);
	__u8 flags;

	if (bpf_skb_change_tail(skb, TRIM_BYTES, 0))
		return 0;
	if (bpf_skb_load_bytes(skb, OFF_OUTER, tc, 2) || bpf_skb_load_bytes(skb, OFF_BTH + 4, &flags, 1))
		return 0;
	/* version(4) | traffic class(8) | flow label(20): DSCP = the class's upper 6 bits */
	__u8 cls = (__u8)(((tc[0] & 0x0f) << 4) | (tc[1] >> 4));
	cls = (__u8)((TRIM_DSCP << 2) | (cls & 0x03));
	tc[0] = (tc[0] & 0xf0) | (cls >> 4);
	tc[1] = (__u8)((cls << 4) | (tc[1] & 0x0f));
	flags |= F_TRIM;
	return bpf_skb_store_bytes(skb, OFF_OUTER, tc, 2, 0) == 0 &&
	       bpf_skb_store_bytes(skb, OFF_OUTER + 4, &outer, 2, 0) == 0 &&
	       bpf_skb_store_bytes(skb, OFF_INNER + 4, &inner, 2, 0) == 0 &&
	       bpf_skb_store_bytes(skb, OFF_UDP + 4, &inner, 2, 0) == 0 &&
	       bpf_skb_store_bytes(skb, OFF_BTH + 4, &flags, 1, 0) == 0;
}

SEC("tc")
int mrclab_egress(struct __sk_buff *skb)
{
	__u32 key = skb->ifindex;
	if (skb->mark == MARK_TRIMMED) { /* the second pass of a packet trimmed here */
		skb->mark = 0;
		skb->priority = CLASS_HIGH;
		return TC_ACT_OK;
	}
	struct port_cfg *cfg = bpf_map_lookup_elem(&port_cfg, &key);
	struct port_state *st = bpf_map_lookup_elem(&port_state, &key);
	if (!cfg || !st)
		return TC_ACT_OK; /* a port the controller has not configured */
	if (cfg->fifo) { /* a host NIC port: its shaper's schedule and limit only */
		__u64 t = bpf_ktime_get_ns(), cost = (__u64)skb->len * cfg->ps_per_byte / 1000;
		__u64 limit = (__u64)cfg->q_limit * cfg->ps_per_byte / 1000; /* the limit's bytes, in ns */
		bpf_spin_lock(&st->lock);
		__u64 start = st->sched_ns > t ? st->sched_ns : t;
		if (cfg->q_limit && start - t + cost > limit) {
			st->queue_full++;
			bpf_spin_unlock(&st->lock);
			return TC_ACT_SHOT;
		}
		st->sched_ns = start + cost;
		st->low++;
		bpf_spin_unlock(&st->lock);
		return TC_ACT_OK;
	}

	/* parse: Ethernet, outer IPv6, inner IPv6, UDP to 4791, BTH */
	__u8 hdr[OFF_BTH + 5];
	int mrc = 0, data = 0, trimmed = 0, ect = 0;
	if (skb->protocol == bpf_htons(0x86DD) && bpf_skb_load_bytes(skb, 0, hdr, OFF_INNER) == 0) {
		ect = (hdr[OFF_OUTER + 1] >> 4) & 0x03;
		if (hdr[OFF_OUTER + 6] == PROTO_IPV6 && skb->len >= OFF_BTH + 12 &&
		    bpf_skb_load_bytes(skb, OFF_INNER, hdr + OFF_INNER, sizeof(hdr) - OFF_INNER) == 0 &&
		    hdr[OFF_INNER + 6] == PROTO_UDP &&
		    ((hdr[OFF_UDP + 2] << 8) | hdr[OFF_UDP + 3]) == ROCE_UDP_PORT) {
			__u8 op = hdr[OFF_BTH];
			mrc = 1;
			trimmed = hdr[OFF_BTH + 4] & F_TRIM;
			data = op == OP_WRITE || op == OP_WRITE_IMM;
		}
	}

	enum verdict v;
	int mark = 0;
	__u64 feed = 0, p_start = 0, p_end = 0;
	struct pfc_state *ps = 0;
	if (cfg->lossless) {
		ps = bpf_map_lookup_elem(&pfc, &key);
		__u32 in = skb->ingress_ifindex; /* the port of this switch the packet came in on */
		struct port_cfg *icfg = bpf_map_lookup_elem(&port_cfg, &in);
		if (icfg && icfg->port_no < 64)
			feed = 1ULL << icfg->port_no;
		if (ps) {
			p_start = ps->pause_start;
			p_end = ps->pause_end;
		}
	}
	__u64 now = bpf_ktime_get_ns();
	bpf_spin_lock(&st->lock);
	if (cfg->loss_threshold && mrc) {
		st->lcg = st->lcg * 1664525 + 1013904223;
		if (((st->lcg ^ cfg->salt) >> 16) < cfg->loss_threshold) {
			st->gray++;
			bpf_spin_unlock(&st->lock);
			return TC_ACT_SHOT;
		}
	}
	if (cfg->rate_pps) { /* drain since the last packet, but for the time the port was paused */
		__u64 dt = now - st->last_ns;
		if (p_start) {
			__u64 hi = p_end ? p_end : now, lo = p_start > st->last_ns ? p_start : st->last_ns;
			if (hi > now)
				hi = now;
			if (hi > lo)
				dt -= hi - lo;
		}
		if (dt > 10000000000ULL)
			st->occ = 0;
		else {
			__u64 drained = dt * cfg->rate_pps / 1000000000ULL * FP_ONE +
					(dt * cfg->rate_pps % 1000000000ULL) * FP_ONE / 1000000000ULL;
			st->occ = st->occ > drained ? st->occ - drained : 0;
		}
	}
	st->last_ns = now;
	__u64 occ = st->occ >> FP_SHIFT;
	if (mrc && (trimmed || !data)) {
		v = V_HIGH;
		st->high++;
	} else if (cfg->trim_t && occ >= cfg->trim_t && mrc && data) {
		v = V_TRIM;
		st->trimmed++;
		st->high++;
	} else if (cfg->q_limit && occ >= cfg->q_limit && !cfg->lossless) {
		v = V_DROP_FULL;
		st->queue_full++;
	} else {
		v = V_LOW;
		st->low++;
		if (cfg->ps_per_byte)
			st->sched_ns = (st->sched_ns > now ? st->sched_ns : now) + (__u64)skb->len * cfg->ps_per_byte / 1000;
		if (cfg->rate_pps)
			st->occ += cfg->frame_bytes ? ((__u64)skb->len << FP_SHIFT) / cfg->frame_bytes : FP_ONE;
		if (cfg->ecn_k && ect && occ >= cfg->ecn_k) {
			mark = 1;
			st->marked++;
		}
	}
	bpf_spin_unlock(&st->lock);
	if (ps && feed && v == V_LOW)
		__sync_fetch_and_or(&ps->feeds, feed);

	switch (v) {
	case V_DROP_FULL:
		return TC_ACT_SHOT;
	case V_TRIM:
		if (!trim(skb))
			return TC_ACT_SHOT;
		skb->mark = MARK_TRIMMED;
		return bpf_redirect(skb->ifindex, 0);
	case V_HIGH:
		skb->priority = CLASS_HIGH;
		return TC_ACT_OK;
	default:
		if (mark)
			set_ce(skb);
		skb->priority = CLASS_LOW;
		return TC_ACT_OK;
	}
}

char LICENSE[] SEC("license") = "GPL";
