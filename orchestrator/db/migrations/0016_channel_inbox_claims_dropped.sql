-- Channel relays own inbox items through the one ownership mechanism of issue 16 (item 1):
-- a claim in `claims` (kind 'channel_item', key = the inbox id; migration 0015) whose epoch
-- every write of the item checks. The per-item lease columns of 0010 are no longer read.
-- A hub still running older code fails on them and relays nothing: the new hubs do.

ALTER TABLE channel_inbox
    DROP COLUMN claimed_by,
    DROP COLUMN claimed_until;
