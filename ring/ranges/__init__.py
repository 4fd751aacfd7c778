"""Ranges: a partition's closed segments spread over the whole ring (Pandos' ranges).

A partition lives whole on its replicas only while its topic keeps
everything local (``local_retention_bytes`` -1, the default). Otherwise its
leader cuts what it has committed into ranges at its closed segments' ends
(``plan.next_ranges``), places each on the token ring by a hash of (topic,
partition, base offset) (``placement``), and has the replication factor's
brokers there copy it and verify its checksum (``copier``; a broker's copies
live in its ``store``). Every range is listed in the partition's catalogue
(``catalogue``: offsets, bytes, checksum, newest timestamp, holders), which
the leader keeps beside its log and hands to every replica of the partition
(``manager``): the catalogue merges, so any replica's copy and the leader's
agree after an exchange. Once a range is on all its holders and every voter
of the partition has a catalogue listing it, the replicas may drop the
segments it covers and keep only a local tail of ``local_retention_bytes``
(``plan.trim_point``; the leader moves its log start, replication carries it
to the followers). A fetch below the local tail is answered from the range's
holders (``remote``), and retention, offsets by timestamp, anti-entropy and
capacity all go through the catalogue.

The decisions (``placement``, ``catalogue``, ``plan``) are pure functions of
their inputs; ``manager``, ``copier`` and ``remote`` only carry them out.
"""
