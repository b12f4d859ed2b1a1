#!/usr/bin/env python3
"""Independent ICRC oracle for uroce's tests, using scapy's RoCE module.

Input (file named on the command line): one packet per line, "<index> <hex>", where <hex>
is a complete IPv4 or IPv6 datagram: IP header, UDP header (destination port 4791),
BTH..pad and the 4 ICRC bytes.

Output: one line per packet, "<index> <icrc> <ipcsum>", where <icrc> is the ICRC that
scapy computes for the datagram, as the 4 wire bytes in hex (least-significant byte
first), and <ipcsum> is "ok"/"bad" (scapy's IPv4 header checksum recomputation agrees /
disagrees with the one in the datagram) or "na" for IPv6.
Exit status 2 if a line cannot be dissected as IP/UDP/BTH.
"""
import sys

from scapy.contrib.roce import BTH  # noqa: F401  (binds UDP port 4791 to BTH)
from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.packet import raw


def main(path):
    out = []
    with open(path, encoding="ascii") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            index, hexdata = line.split()
            data = bytes.fromhex(hexdata)
            version = data[0] >> 4
            pkt = IP(data) if version == 4 else IPv6(data)
            if BTH not in pkt:
                print(f"packet {index}: scapy found no BTH", file=sys.stderr)
                return 2
            icrc = pkt[BTH].compute_icrc(None)
            if version == 4:
                rebuilt = IP(raw(pkt))
                on_wire = rebuilt.chksum
                del rebuilt.chksum
                recomputed = IP(raw(rebuilt)).chksum
                csum = "ok" if recomputed == on_wire else "bad"
            else:
                csum = "na"
            out.append(f"{index} {icrc.hex()} {csum}")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
