--[[
mrc.lua: a Wireshark / tshark (4.0, Lua 5.2) dissector for mrclab's MRC wire format.

Frame (docs/protocol.md; protocol/headers.py holds the authoritative struct layouts):

  Ethernet | outer IPv6 (dst = SRv6 uSID container, flow label = EV[31:16], traffic class =
  DSCP|ECN, DSCP 0x2A = trimmed by a switch) | inner IPv6 | UDP (sport = EV[15:0], dport 4791)
  | BTH (12) | body | ICRC (4: CRC-32, zlib's, of BTH .. end of body; a trimmed packet has none)

  0xC6 MRC Write, 0xC7 MRC Write-with-Immediate: MRCX (20) | RETH (16) | [IMM (4)] | payload
  0xD1 ACK, 0xDC SACK, 0xDD NACK: SACK body (36)
  0xDE probe (request / reply): probe body (20)
  0x81 CNP: 16 reserved bytes

Load it for one run:

  tshark -X lua_script:traffic/wireshark/mrc.lua -r capture.pcap
  wireshark -X lua_script:traffic/wireshark/mrc.lua capture.pcap

or for good: copy it into the personal Lua plugins folder, ~/.local/lib/wireshark/plugins/
(Wireshark's "About > Folders" names it).

It takes UDP port 4791 over from Wireshark's InfiniBand (RoCEv2 "RRoCE") dissector (at load and
again at every new capture) and hands frames whose opcode is not one of the above back to it, so
real RoCEv2 traffic still dissects. UDP tries the lower port's dissector first: an EV whose source
port (EV[15:0] = plane << 12 | T1, below 4791 for planes 0 and 1) is some other protocol's port
(plane 0, T1 53: DNS) is dissected as that protocol unless you add -o udp.try_heuristic_first:TRUE
(this script also registers itself as a UDP heuristic). mrclab's default fabric has no such EV.

mrclab sends UDP checksum 0 over IPv6, which Wireshark's UDP dissector flags on every frame
(Error "Illegal checksum value (0)") before any dissector of the payload runs, whatever the
tunnel around it (it looks only at the innermost IP version and this preference). Accept it with
the UDP preference (this script could flip it itself with set_preference(), but deliberately does
not: it would hide a real zero checksum in any other IPv6 UDP traffic of the capture):

  tshark -o udp.ignore_ipv6_zero_checksum:TRUE -X lua_script:traffic/wireshark/mrc.lua ...

(Wireshark: Edit > Preferences > Protocols > UDP > "Ignore zero-value UDP checksums over IPv6").

Display filter fields (all under "mrc."): opcode, qp, psn, flags.retx, flags.trim, ev, ev.entropy,
ev.plane, ev.t1, ecn, trimmed, msn, msg_len, msg_crc, msg_offset, mrcx.flags.last, mrcx.stamp, port_state,
reth.va, reth.rkey, reth.dma_len, imm, payload, sack.cum_psn, sack.base_psn, sack.bitmap,
sack.trim_bitmap, sack.echo_ev, sack.echo_psn, sack.echo_wire, sack.ecn, sack.trim, sack.seq, sack.received,
sack.trimmed, probe.id, probe.is_reply, probe.ev, probe.t_send_ns, cnp.rsvd, trimmed_bytes, icrc,
icrc.calculated, icrc.status (0 Bad, 1 Good, 2 Unverified, 3 Not present: trimmed).
Expert items: mrc.expert.bad_icrc (Warn), mrc.expert.malformed (Error: a body or header too short
for its opcode, a trimmed packet that is not a bare Write; it also sets _ws.malformed),
mrc.expert.trailing and mrc.expert.dma_len (Warn), mrc.expert.retx and mrc.expert.trimmed (Note),
mrc.expert.snapped (Note: snap length). Preference mrc.verify_icrc (default TRUE): the ICRC check
is a table-driven CRC-32 in Lua, about 0.08 us per byte (0.65 ms for an 8 KiB packet).
Examples: mrc.ev.plane == 2 && mrc.opcode == 0xc7;  mrc.icrc.status == "Bad";  mrc.trimmed == 1
]]

local MRC_PORT = 4791
local TRIM_DSCP = 0x2A

local bxor, band, rshift = bit32.bxor, bit32.band, bit32.rshift

local mrc = Proto("mrc", "MRC (Multipath Reliable Connection)")

-- ---- opcodes ----------------------------------------------------------------------------------
local OP_WRITE, OP_WRITE_IMM, OP_ACK, OP_SACK, OP_NACK, OP_PROBE, OP_CNP = 0xC6, 0xC7, 0xD1, 0xDC, 0xDD, 0xDE, 0x81
local OPNAMES = {
    [OP_WRITE] = "MRC Write",
    [OP_WRITE_IMM] = "MRC Write-with-Immediate",
    [OP_ACK] = "ACK",
    [OP_SACK] = "SACK",
    [OP_NACK] = "NACK",
    [OP_PROBE] = "Probe",
    [OP_CNP] = "CNP",
}

-- sizes (protocol/headers.py)
local BTH_SIZE, MRCX_SIZE, RETH_SIZE, IMM_SIZE = 12, 20, 16, 4
local SACK_SIZE, PROBE_SIZE, CNP_SIZE, ICRC_SIZE = 36, 20, 16, 4

-- ---- fields -------------------------------------------------------------------------------------
local CHECKSUM_STATUS = {[0] = "Bad", [1] = "Good", [2] = "Unverified", [3] = "Not present"}
local ECN_NAMES = {[0] = "Not-ECT", [1] = "ECT(1)", [2] = "ECT(0)", [3] = "CE"}

local f = {
    -- BTH
    opcode = ProtoField.uint8("mrc.opcode", "Opcode", base.HEX, OPNAMES),
    se = ProtoField.bool("mrc.se", "Solicited event", 8, nil, 0x80),
    migreq = ProtoField.bool("mrc.migreq", "MigReq", 8, nil, 0x40),
    padcnt = ProtoField.uint8("mrc.padcnt", "Pad count", base.DEC, nil, 0x30),
    tver = ProtoField.uint8("mrc.tver", "Header version", base.DEC, nil, 0x0F),
    pkey = ProtoField.uint16("mrc.pkey", "P_Key", base.HEX),
    flags = ProtoField.uint8("mrc.flags", "MRC flags", base.HEX),
    flags_retx = ProtoField.bool("mrc.flags.retx", "RETX (retransmission)", 8, nil, 0x01),
    flags_trim = ProtoField.bool("mrc.flags.trim", "TRIM (payload cut by a switch)", 8, nil, 0x02),
    qp = ProtoField.uint24("mrc.qp", "Destination QP", base.DEC),
    ackreq = ProtoField.bool("mrc.ackreq", "AckReq", 8, nil, 0x80),
    psn = ProtoField.uint24("mrc.psn", "PSN", base.DEC),
    -- the EV, from the UDP source port and the outer flow label
    ev = ProtoField.uint32("mrc.ev", "EV", base.HEX),
    ev_entropy = ProtoField.uint16("mrc.ev.entropy", "Entropy (EV[31:16], outer flow label)", base.HEX),
    ev_plane = ProtoField.uint8("mrc.ev.plane", "Plane (EV[15:12])", base.DEC),
    ev_t1 = ProtoField.uint16("mrc.ev.t1", "T1 (EV[11:0])", base.DEC),
    ecn = ProtoField.uint8("mrc.ecn", "Outer ECN", base.DEC, ECN_NAMES),
    trimmed = ProtoField.bool("mrc.trimmed", "Trimmed (outer DSCP 0x2A)"),
    -- MRCX
    msn = ProtoField.uint32("mrc.msn", "MSN", base.DEC),
    msg_len = ProtoField.uint32("mrc.msg_len", "Message length", base.DEC),
    msg_crc = ProtoField.uint32("mrc.msg_crc", "Message CRC-32", base.HEX),
    msg_offset = ProtoField.uint32("mrc.msg_offset", "Offset in message", base.DEC),
    mrcx_flags = ProtoField.uint8("mrc.mrcx.flags", "MRCX flags", base.HEX),
    mrcx_last = ProtoField.bool("mrc.mrcx.flags.last", "LAST (ends its message)", 8, nil, 0x01),
    mrcx_stamp = ProtoField.uint16("mrc.mrcx.stamp", "Send stamp (100 us units, mod 2^16)", base.DEC),
    -- port-state bitmap (data, SACK/NACK/ACK, probe)
    port_state = ProtoField.uint8("mrc.port_state", "Port state", base.HEX),
    -- RETH, immediate, payload
    reth_va = ProtoField.uint64("mrc.reth.va", "Virtual address", base.HEX),
    reth_rkey = ProtoField.uint32("mrc.reth.rkey", "R_Key", base.HEX),
    reth_dma_len = ProtoField.uint32("mrc.reth.dma_len", "DMA length", base.DEC),
    imm = ProtoField.uint32("mrc.imm", "Immediate data", base.HEX),
    payload = ProtoField.bytes("mrc.payload", "Payload"),
    trimmed_bytes = ProtoField.uint32("mrc.trimmed_bytes", "Payload bytes trimmed by a switch", base.DEC),
    -- SACK / NACK / ACK
    sack_cum = ProtoField.uint32("mrc.sack.cum_psn", "Cumulative PSN", base.DEC),
    sack_base = ProtoField.uint32("mrc.sack.base_psn", "Base PSN", base.DEC),
    sack_bitmap = ProtoField.uint64("mrc.sack.bitmap", "Received bitmap", base.HEX),
    sack_trim_bitmap = ProtoField.uint64("mrc.sack.trim_bitmap", "Trimmed bitmap", base.HEX),
    sack_echo_ev = ProtoField.uint32("mrc.sack.echo_ev", "Echoed EV", base.HEX),
    sack_echo_psn = ProtoField.uint32("mrc.sack.echo_psn", "Echoed PSN", base.DEC),
    sack_flags = ProtoField.uint8("mrc.sack.flags", "Flags", base.HEX),
    sack_ecn = ProtoField.bool("mrc.sack.ecn", "ECN echo (that arrival carried CE)", 8, nil, 0x01),
    sack_trim = ProtoField.bool("mrc.sack.trim", "TRIM (NACK for a trimmed packet)", 8, nil, 0x02),
    sack_seq = ProtoField.bool("mrc.sack.seq", "SEQ (go-back-N sequence error)", 8, nil, 0x04),
    sack_echo_wire = ProtoField.uint16("mrc.sack.echo_wire", "Echoed one-way time (100 us units; 65535: none)", base.DEC),
    sack_received = ProtoField.string("mrc.sack.received", "PSNs received (bitmap)"),
    sack_trimmed = ProtoField.string("mrc.sack.trimmed", "PSNs trimmed (trim bitmap)"),
    -- probe
    probe_id = ProtoField.uint32("mrc.probe.id", "Probe ID", base.DEC),
    probe_reply = ProtoField.uint8("mrc.probe.is_reply", "Kind", base.DEC, {[0] = "request", [1] = "reply"}),
    probe_rsvd = ProtoField.uint16("mrc.probe.rsvd", "Reserved", base.HEX),
    probe_ev = ProtoField.uint32("mrc.probe.ev", "Probed EV", base.HEX),
    probe_t_send = ProtoField.uint64("mrc.probe.t_send_ns", "Send time (ns)", base.DEC),
    -- CNP
    cnp_rsvd = ProtoField.bytes("mrc.cnp.rsvd", "Reserved"),
    -- ICRC
    icrc = ProtoField.uint32("mrc.icrc", "ICRC", base.HEX),
    icrc_calc = ProtoField.uint32("mrc.icrc.calculated", "Calculated ICRC", base.HEX),
    icrc_status = ProtoField.uint8("mrc.icrc.status", "ICRC status", base.DEC, CHECKSUM_STATUS),
    trailer = ProtoField.bytes("mrc.trailer", "Unexpected trailing bytes"),
}
local f_plane_up = {}
for p = 0, 7 do
    f_plane_up[p] = ProtoField.bool("mrc.port_state.plane" .. p, "Plane " .. p .. " port up", 8, nil,
        bit32.lshift(1, p))
end

local plist = {}
for _, v in pairs(f) do plist[#plist + 1] = v end
for p = 0, 7 do plist[#plist + 1] = f_plane_up[p] end
mrc.fields = plist

local ef = {
    bad_icrc = ProtoExpert.new("mrc.expert.bad_icrc", "Bad ICRC", expert.group.CHECKSUM, expert.severity.WARN),
    malformed = ProtoExpert.new("mrc.expert.malformed", "Malformed MRC packet", expert.group.MALFORMED,
        expert.severity.ERROR),
    trailing = ProtoExpert.new("mrc.expert.trailing", "Unexpected bytes after the body", expert.group.PROTOCOL,
        expert.severity.WARN),
    dma_len = ProtoExpert.new("mrc.expert.dma_len", "DMA length differs from the payload's", expert.group.PROTOCOL,
        expert.severity.WARN),
    trimmed = ProtoExpert.new("mrc.expert.trimmed", "Payload trimmed by a switch", expert.group.SEQUENCE,
        expert.severity.NOTE),
    retx = ProtoExpert.new("mrc.expert.retx", "Retransmission", expert.group.SEQUENCE, expert.severity.NOTE),
    snapped = ProtoExpert.new("mrc.expert.snapped", "Packet size limited during capture", expert.group.UNDECODED,
        expert.severity.NOTE),
}
mrc.experts = {ef.bad_icrc, ef.malformed, ef.trailing, ef.dma_len, ef.trimmed, ef.retx, ef.snapped}

mrc.prefs.verify_icrc = Pref.bool("Verify the ICRC", true,
    "Compute the CRC-32 of BTH .. end of body and compare it with the ICRC (costs CPU on big captures)")

-- ---- the outer IPv6 header, read back from the IPv6 dissector ----------------------------------
-- Field extractors return every instance in tree order: the first is the outer header.
local fx_flow = Field.new("ipv6.flow")
local fx_tclass = Field.new("ipv6.tclass")

-- ---- CRC-32 (IEEE 802.3, reflected, zlib's), table-driven ---------------------------------------
local CRC_T = {}
for i = 0, 255 do
    local c = i
    for _ = 1, 8 do
        if c % 2 == 1 then c = bxor(0xEDB88320, rshift(c, 1)) else c = rshift(c, 1) end
    end
    CRC_T[i] = c
end

local sbyte = string.byte

--- CRC-32 of the Lua string ``s``: one table look-up and two XORs per byte; the shift right by 8
--- is arithmetic (no call), which makes it about twice as fast as the textbook loop in Lua 5.2.
local function crc32(s)
    local crc = 0xFFFFFFFF
    local n = #s
    local i = 1
    while i + 7 <= n do
        local b1, b2, b3, b4, b5, b6, b7, b8 = sbyte(s, i, i + 7)
        local c = crc
        c = bxor(CRC_T[bxor(c % 256, b1)], (c - c % 256) / 256)
        c = bxor(CRC_T[bxor(c % 256, b2)], (c - c % 256) / 256)
        c = bxor(CRC_T[bxor(c % 256, b3)], (c - c % 256) / 256)
        c = bxor(CRC_T[bxor(c % 256, b4)], (c - c % 256) / 256)
        c = bxor(CRC_T[bxor(c % 256, b5)], (c - c % 256) / 256)
        c = bxor(CRC_T[bxor(c % 256, b6)], (c - c % 256) / 256)
        c = bxor(CRC_T[bxor(c % 256, b7)], (c - c % 256) / 256)
        c = bxor(CRC_T[bxor(c % 256, b8)], (c - c % 256) / 256)
        crc = c
        i = i + 8
    end
    while i <= n do
        crc = bxor(CRC_T[bxor(crc % 256, sbyte(s, i))], (crc - crc % 256) / 256)
        i = i + 1
    end
    return bxor(crc, 0xFFFFFFFF)
end

-- per-capture cache of computed ICRCs (the GUI dissects a frame again on every click)
local icrc_cache = {}

-- ---- helpers --------------------------------------------------------------------------------------
local function ev_text(ev)
    return string.format("0x%08x (plane %d, T1 %d, entropy 0x%04x)", ev, rshift(ev, 12) % 16, ev % 4096,
        rshift(ev, 16))
end

--- "a-b, c, d-e" of the bits set in the 64-bit ``bm`` (UInt64), bit i = PSN base + i
local function psn_ranges(bm, base)
    local out, start, prev = {}, nil, nil
    local lo, hi = bm:lower(), bm:higher()
    for i = 0, 63 do
        local word, bit = lo, i
        if i >= 32 then word, bit = hi, i - 32 end
        if band(rshift(word, bit), 1) == 1 then
            local psn = base + i
            if start == nil then start = psn end
            prev = psn
        elseif start ~= nil then
            out[#out + 1] = (start == prev) and tostring(start) or (start .. "-" .. prev)
            start = nil
        end
    end
    if start ~= nil then out[#out + 1] = (start == prev) and tostring(start) or (start .. "-" .. prev) end
    if #out == 0 then return "none" end
    return table.concat(out, ", ")
end

local function add_port_state(tree, range)
    local item = tree:add(f.port_state, range)
    local v = range:uint()
    local up = {}
    for p = 0, 7 do
        if band(v, bit32.lshift(1, p)) ~= 0 then up[#up + 1] = tostring(p) end
    end
    item:append_text(" (planes up: " .. (#up > 0 and table.concat(up, ",") or "none") .. ")")
    for p = 0, 7 do item:add(f_plane_up[p], range) end
    return v
end

--- True (with a note) when the capture stopped before [off, off + need): a snap length, not a
--- malformed packet, so nothing past it is read.
local snap_noted = false -- one note per packet
local function snapped(tvb, tree, off, need)
    if off + need <= tvb:len() then return false end
    if snap_noted then return true end
    snap_noted = true
    tree:add_proto_expert_info(ef.snapped, string.format("Packet size limited during capture: %d of %d bytes captured",
        tvb:len(), tvb:reported_len()))
    return true
end

--- Adds the n bytes at off as ``field`` (a ProtoField, or a label for a text item), as far as captured.
local function add_bytes(tree, tvb, off, n, field)
    local have = math.min(n, tvb:len() - off)
    if have <= 0 then return nil end
    if type(field) == "string" then return tree:add(tvb(off, have), field) end
    return tree:add(field, tvb(off, have))
end

--- Marks the packet malformed (our Error expert item, never an exception) and returns false.
local function malformed(item, pinfo, what)
    item:add_proto_expert_info(ef.malformed, "Malformed MRC packet: " .. what)
    pinfo.cols.info:append(" [MALFORMED: " .. what .. "]")
    return false
end

--- Adds the bytes [off, stop) that are left when a body is too short, then reports it.
local function truncated(tvb, tree, pinfo, off, stop, what, need)
    local have = stop - off
    if have > 0 then
        add_bytes(tree, tvb, off, have, string.format("%s (truncated: %d of %d bytes)", what, have, need))
    end
    return malformed(tree, pinfo, string.format("%s truncated: %d of %d bytes", what, math.max(have, 0), need))
end

-- ---- bodies ---------------------------------------------------------------------------------------
-- Each returns (ok, info text) and dissects tvb[off, stop).

local function dissect_data(tvb, pinfo, tree, op, off, stop, trimmed)
    local need = MRCX_SIZE + RETH_SIZE
    local imm = (op == OP_WRITE_IMM) and not trimmed -- a switch cuts a packet after its RETH
    if imm then need = need + IMM_SIZE end
    if stop - off < need then return truncated(tvb, tree, pinfo, off, stop, "MRCX/RETH", need), "" end
    if snapped(tvb, tree, off, need) then return true, "" end

    local x = tree:add(tvb(off, MRCX_SIZE), "MRCX (MRC extension header)")
    local msn = tvb(off, 4):uint()
    x:add(f.msn, tvb(off, 4))
    x:add(f.msg_len, tvb(off + 4, 4))
    x:add(f.msg_crc, tvb(off + 8, 4))
    x:add(f.msg_offset, tvb(off + 12, 4))
    local xf = x:add(f.mrcx_flags, tvb(off + 16, 1))
    xf:add(f.mrcx_last, tvb(off + 16, 1))
    add_port_state(x, tvb(off + 17, 1))
    x:add(f.mrcx_stamp, tvb(off + 18, 2))
    x:append_text(string.format(", MSN %d, offset %d of %d", msn, tvb(off + 12, 4):uint(), tvb(off + 4, 4):uint()))
    off = off + MRCX_SIZE

    local r = tree:add(tvb(off, RETH_SIZE), "RETH (RDMA extended transport header)")
    r:add(f.reth_va, tvb(off, 8))
    r:add(f.reth_rkey, tvb(off + 8, 4))
    r:add(f.reth_dma_len, tvb(off + 12, 4))
    local dma_len = tvb(off + 12, 4):uint()
    r:append_text(string.format(", VA 0x%s, %d bytes", tostring(tvb(off, 8):uint64():tohex()), dma_len))
    off = off + RETH_SIZE

    local info = string.format(" MSN=%d len=%d", msn, dma_len)
    if imm then
        tree:add(f.imm, tvb(off, IMM_SIZE))
        info = info .. string.format(" IMM=0x%08x", tvb(off, IMM_SIZE):uint())
        off = off + IMM_SIZE
    end
    if trimmed then
        if stop > off then
            add_bytes(tree, tvb, off, stop - off, f.trailer)
            local what = string.format("%d bytes after the RETH of a trimmed packet", stop - off)
            return malformed(tree, pinfo, what), info
        end
        tree:add(f.trimmed_bytes, dma_len):set_generated()
        return true, info
    end
    local plen = stop - off
    if plen > 0 then
        add_bytes(tree, tvb, off, plen, f.payload)
        snapped(tvb, tree, off, plen)
    end
    if plen ~= dma_len then
        tree:add_proto_expert_info(ef.dma_len, string.format("DMA length %d, payload %d bytes", dma_len, plen))
    end
    return true, info
end

local function dissect_sack(tvb, pinfo, tree, op, off, stop)
    if stop - off < SACK_SIZE then return truncated(tvb, tree, pinfo, off, stop, "SACK body", SACK_SIZE), "" end
    if snapped(tvb, tree, off, SACK_SIZE) then return true, "" end
    local s = tree:add(tvb(off, SACK_SIZE), (op == OP_ACK and "ACK" or op == OP_NACK and "NACK" or "SACK") .. " body")
    local cum = tvb(off, 4):uint()
    local base_psn = tvb(off + 4, 4):uint()
    s:add(f.sack_cum, tvb(off, 4))
    s:add(f.sack_base, tvb(off + 4, 4))
    s:add(f.sack_bitmap, tvb(off + 8, 8))
    s:add(f.sack_trim_bitmap, tvb(off + 16, 8))
    s:add(f.sack_received, psn_ranges(tvb(off + 8, 8):uint64(), base_psn)):set_generated()
    s:add(f.sack_trimmed, psn_ranges(tvb(off + 16, 8):uint64(), base_psn)):set_generated()
    local eev = tvb(off + 24, 4):uint()
    s:add(f.sack_echo_ev, tvb(off + 24, 4)):append_text(ev_text(eev):sub(11))
    s:add(f.sack_echo_psn, tvb(off + 28, 4))
    local fl = tvb(off + 32, 1):uint()
    local fi = s:add(f.sack_flags, tvb(off + 32, 1))
    fi:add(f.sack_ecn, tvb(off + 32, 1))
    fi:add(f.sack_trim, tvb(off + 32, 1))
    fi:add(f.sack_seq, tvb(off + 32, 1))
    add_port_state(s, tvb(off + 33, 1))
    s:add(f.sack_echo_wire, tvb(off + 34, 2))
    local info = string.format(" cum=%d echo_psn=%d", cum, tvb(off + 28, 4):uint())
    local tags = {}
    if band(fl, 1) ~= 0 then tags[#tags + 1] = "ECN" end
    if band(fl, 2) ~= 0 then tags[#tags + 1] = "TRIM" end
    if band(fl, 4) ~= 0 then tags[#tags + 1] = "SEQ" end
    if #tags > 0 then info = info .. " [" .. table.concat(tags, ",") .. "]" end
    off = off + SACK_SIZE
    if stop > off then
        add_bytes(tree, tvb, off, stop - off, f.trailer)
        tree:add_proto_expert_info(ef.trailing)
    end
    return true, info
end

local function dissect_probe(tvb, pinfo, tree, off, stop)
    if stop - off < PROBE_SIZE then return truncated(tvb, tree, pinfo, off, stop, "probe body", PROBE_SIZE), "" end
    if snapped(tvb, tree, off, PROBE_SIZE) then return true, "" end
    local reply = tvb(off + 4, 1):uint()
    local p = tree:add(tvb(off, PROBE_SIZE), reply ~= 0 and "Probe reply" or "Probe request")
    p:add(f.probe_id, tvb(off, 4))
    p:add(f.probe_reply, tvb(off + 4, 1))
    add_port_state(p, tvb(off + 5, 1))
    p:add(f.probe_rsvd, tvb(off + 6, 2))
    local pev = tvb(off + 8, 4):uint()
    p:add(f.probe_ev, tvb(off + 8, 4)):append_text(ev_text(pev):sub(11))
    p:add(f.probe_t_send, tvb(off + 12, 8))
    off = off + PROBE_SIZE
    if stop > off then
        add_bytes(tree, tvb, off, stop - off, f.trailer)
        tree:add_proto_expert_info(ef.trailing)
    end
    return true, string.format(" id=%d probed=0x%08x", tvb(off - PROBE_SIZE, 4):uint(), pev)
end

local function dissect_cnp(tvb, pinfo, tree, off, stop)
    if stop - off < CNP_SIZE then return truncated(tvb, tree, pinfo, off, stop, "CNP body", CNP_SIZE), "" end
    if snapped(tvb, tree, off, CNP_SIZE) then return true, "" end
    tree:add(f.cnp_rsvd, tvb(off, CNP_SIZE))
    off = off + CNP_SIZE
    if stop > off then
        add_bytes(tree, tvb, off, stop - off, f.trailer)
        tree:add_proto_expert_info(ef.trailing)
    end
    return true, ""
end

-- ---- the dissector --------------------------------------------------------------------------------
local ib_handle = nil -- Wireshark's InfiniBand dissector: frames on 4791 that are not MRC go to it

function mrc.dissector(tvb, pinfo, tree)
    local len = tvb:reported_len()
    if len < 1 or tvb:len() < 1 then return 0 end
    snap_noted = false
    local op = tvb(0, 1):uint()
    if OPNAMES[op] == nil and ib_handle ~= nil then
        return ib_handle:call(tvb, pinfo, tree)
    end

    pinfo.cols.protocol = "MRC"
    local root = tree:add(mrc, tvb())

    -- EV and the outer header's marks (generated: they live in the UDP and outer IPv6 headers)
    local flows, tcs = { fx_flow() }, { fx_tclass() }
    local flow = flows[1] and flows[1].value or 0
    local tclass = tcs[1] and tcs[1].value or 0
    local ev = band(flow, 0xFFFF) * 65536 + pinfo.src_port
    local dscp, ecn = rshift(tclass, 2) % 64, tclass % 4
    local trimmed = (dscp == TRIM_DSCP)
    local evi = root:add(f.ev, ev)
    evi:set_generated()
    evi:append_text(string.format(" (UDP source port 0x%04x, outer flow label 0x%05x)", pinfo.src_port, flow))
    evi:add(f.ev_entropy, rshift(ev, 16)):set_generated()
    evi:add(f.ev_plane, rshift(ev, 12) % 16):set_generated()
    evi:add(f.ev_t1, ev % 4096):set_generated()
    root:add(f.ecn, ecn):set_generated()
    local ti = root:add(f.trimmed, trimmed)
    ti:set_generated()

    local name = OPNAMES[op] or string.format("Unknown opcode 0x%02x", op)
    pinfo.cols.info = name
    if len < BTH_SIZE then
        root:add(f.opcode, tvb(0, 1))
        root:append_text(", " .. name)
        malformed(root, pinfo, string.format("BTH truncated: %d of %d bytes", len, BTH_SIZE))
        return len
    end

    if snapped(tvb, root, 0, BTH_SIZE) then
        root:add(f.opcode, tvb(0, 1))
        return len
    end

    -- BTH
    local qp = tvb(5, 3):uint()
    local psn = tvb(9, 3):uint()
    local flags = tvb(4, 1):uint()
    local b = root:add(tvb(0, BTH_SIZE), "BTH (base transport header)")
    b:add(f.opcode, tvb(0, 1))
    b:add(f.se, tvb(1, 1))
    b:add(f.migreq, tvb(1, 1))
    b:add(f.padcnt, tvb(1, 1))
    b:add(f.tver, tvb(1, 1))
    b:add(f.pkey, tvb(2, 2))
    local fl = b:add(f.flags, tvb(4, 1))
    fl:add(f.flags_retx, tvb(4, 1))
    fl:add(f.flags_trim, tvb(4, 1))
    b:add(f.qp, tvb(5, 3))
    b:add(f.ackreq, tvb(8, 1))
    b:add(f.psn, tvb(9, 3))
    b:append_text(string.format(", %s, QP %d, PSN %d", name, qp, psn))

    if op == OP_PROBE and tvb:len() >= BTH_SIZE + PROBE_SIZE then
        name = (tvb(BTH_SIZE + 4, 1):uint() ~= 0) and "Probe reply" or "Probe request"
    end
    root:append_text(string.format(", %s, QP %d, PSN %d, EV 0x%08x", name, qp, psn, ev))
    local info = string.format("%s QP=%d PSN=%d EV=0x%08x", name, qp, psn, ev)
    if band(flags, 1) ~= 0 then
        info = info .. " [RETX]"
        b:add_proto_expert_info(ef.retx)
    end

    -- the body ends where the ICRC starts; a trimmed packet has no ICRC
    local is_data = (op == OP_WRITE or op == OP_WRITE_IMM)
    if trimmed then
        info = info .. " [TRIMMED]"
        ti:add_proto_expert_info(ef.trimmed)
        if not is_data then
            pinfo.cols.info = info
            malformed(root, pinfo, "a trimmed packet must be a Write")
            return len
        end
    end
    local stop = trimmed and len or (len - ICRC_SIZE)
    if stop < BTH_SIZE then
        pinfo.cols.info = info
        add_bytes(root, tvb, BTH_SIZE, len - BTH_SIZE, "ICRC (truncated)")
        malformed(root, pinfo, string.format("no room for the ICRC: %d bytes after the BTH", len - BTH_SIZE))
        return len
    end

    pinfo.cols.info = info
    local ok, more
    if is_data then
        ok, more = dissect_data(tvb, pinfo, root, op, BTH_SIZE, stop, trimmed)
    elseif op == OP_SACK or op == OP_NACK or op == OP_ACK then
        ok, more = dissect_sack(tvb, pinfo, root, op, BTH_SIZE, stop)
    elseif op == OP_PROBE then
        ok, more = dissect_probe(tvb, pinfo, root, BTH_SIZE, stop)
    elseif op == OP_CNP then
        ok, more = dissect_cnp(tvb, pinfo, root, BTH_SIZE, stop)
    else -- no InfiniBand dissector to hand it to
        ok, more = malformed(root, pinfo, string.format("unknown opcode 0x%02x", op)), ""
    end
    if ok then pinfo.cols.info:append(more) end

    -- ICRC
    if not trimmed and snapped(tvb, root, stop, ICRC_SIZE) then
        root:add(f.icrc_status, 2):set_generated() -- Unverified: not captured
    elseif not trimmed then
        local ic = tvb(stop, ICRC_SIZE):uint()
        local item = root:add(f.icrc, tvb(stop, ICRC_SIZE))
        local status = 2 -- Unverified
        if mrc.prefs.verify_icrc then
            local key = pinfo.number
            local calc = icrc_cache[key]
            if calc == nil then
                calc = crc32(tvb:raw(0, stop))
                icrc_cache[key] = calc
            end
            item:add(f.icrc_calc, tvb(stop, ICRC_SIZE), calc):set_generated()
            if calc == ic then
                status = 1
                item:append_text(" [correct]")
            else
                status = 0
                item:append_text(string.format(" [incorrect, should be 0x%08x]", calc))
                item:add_proto_expert_info(ef.bad_icrc, string.format("Bad ICRC 0x%08x, should be 0x%08x", ic, calc))
                pinfo.cols.info:append(" [BAD ICRC]")
            end
        end
        item:add(f.icrc_status, tvb(stop, ICRC_SIZE), status):set_generated()
    else
        root:add(f.icrc_status, 3):set_generated() -- Not present
    end
    return len
end

-- ---- registration -------------------------------------------------------------------------------
local udp_port = DissectorTable.get("udp.port")

--- Takes UDP port 4791 (again) unless it is already ours, remembering whom it took it from.
local our_name = nil -- tostring() of our own handle (a protocol's short name: "MRC")
local function claim_port()
    local cur = udp_port:get_dissector(MRC_PORT)
    if our_name == nil then
        local own = Dissector.get("mrc")
        our_name = own and tostring(own) or "MRC"
    end
    if cur ~= nil and tostring(cur) == our_name then return end
    if cur ~= nil then ib_handle = cur end
    udp_port:add(MRC_PORT, mrc)
end

--- The same dissector as a UDP heuristic: it takes a datagram to port 4791 whose first byte is an
--- MRC opcode. UDP tries port dissectors on the lower port first, so an EV whose source port (EV
--- bits 15..0 = plane << 12 | T1) is below 4791 and registered to another protocol (plane 0, T1 53:
--- DNS) goes to that protocol; `-o udp.try_heuristic_first:TRUE` makes this heuristic run first.
local function heuristic(tvb, pinfo, tree)
    if pinfo.dst_port ~= MRC_PORT or tvb:len() < BTH_SIZE or OPNAMES[tvb(0, 1):uint()] == nil then
        return false
    end
    mrc.dissector(tvb, pinfo, tree)
    return true
end
mrc:register_heuristic("udp", heuristic)

-- At load time (after the built-in dissectors' hand-offs: InfiniBand already holds 4791) and again
-- at every new capture, in case a preference (infiniband.rroce.port) gave the port back to it.
claim_port()

function mrc.init()
    icrc_cache = {}
    claim_port()
end
