#!/usr/bin/env python3
"""Independent ICRC and IP-header oracle for uroce's tests, using scapy's RoCE module.

Input (file named on the command line): one packet per line, "<index> <hex>", where <hex>
is a complete IPv4 or IPv6 datagram (as built by a test or as a capture recorded it):
IP header, UDP header (destination port 4791), BTH..pad and the 4 ICRC bytes.

Output: one line per packet, "<index> <icrc> <ipcsum> <id> <df>", where
* <icrc> is the ICRC that scapy computes over the datagram's own IP and UDP headers, as
  the 4 wire bytes in hex (least-significant byte first);
* <ipcsum> is "ok"/"bad": scapy's recomputation of the IPv4 header checksum agrees /
  disagrees with the one in the datagram;
* <id> and <df> are the IPv4 Identification (decimal) and the Don't-Fragment flag (0/1)
  as scapy dissects them.
<ipcsum>, <id> and <df> are "na" for IPv6.
Exit status 2 if a line cannot be dissected as IP/UDP/BTH.
"""
import sys

from scapy.contrib.roce import BTH  # noqa: F401  (binds UDP port 4791 to BTH)
from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.packet import raw


def ipv4_columns(pkt):
    """The <ipcsum> <id> <df> columns of an IPv4 datagram."""
    rebuilt = IP(raw(pkt))
    on_wire = rebuilt.chksum
    del rebuilt.chksum
    recomputed = IP(raw(rebuilt)).chksum
    csum = "ok" if recomputed == on_wire else "bad"
    df = "1" if pkt[IP].flags.DF else "0"
    return f"{csum} {pkt[IP].id} {df}"


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
            ip = ipv4_columns(pkt) if version == 4 else "na na na"
            out.append(f"{index} {icrc.hex()} {ip}")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
