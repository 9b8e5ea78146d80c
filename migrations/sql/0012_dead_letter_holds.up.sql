-- workpump schema, version 12: a listed dead letter says whether it holds
-- its stream.
--
-- wp_find_dead_letters returns one more column, holds_stream; its return
-- type changes, so it is dropped and created again.

DROP FUNCTION {{.S}}.wp_find_dead_letters(text, text, text, text, timestamptz, timestamptz, uuid[], bigint, integer);

-- wp_find_dead_letters returns the dead letters that match every non-NULL
-- filter argument, numbered after p_after, in number order, at most
-- p_limit, each with whether it holds its stream (wp_holds_stream).
-- p_error matches a substring of the error, ignoring case; p_since <=
-- dead_lettered_at < p_until.
CREATE FUNCTION {{.S}}.wp_find_dead_letters(
    p_category text,
    p_name     text,
    p_stream   text,
    p_error    text,
    p_since    timestamptz,
    p_until    timestamptz,
    p_ids      uuid[],
    p_after    bigint,
    p_limit    integer)
RETURNS TABLE (
    dead_letter_id   bigint,
    category         text,
    id               uuid,
    stream_id        text,
    partition_number integer,
    name             text,
    message_type     text,
    payload          bytea,
    metadata         json,
    attempts         integer,
    seq              bigint,
    scheduled_for    timestamptz,
    created_at       timestamptz,
    error            text,
    dead_lettered_at timestamptz,
    holds_stream     boolean)
LANGUAGE sql STABLE
AS $fn$
    SELECT d.dead_letter_id, d.category, d.id, d.stream_id, d.partition_number, d.name, d.message_type, d.payload,
           d.metadata, d.attempts, d.seq, d.scheduled_for, d.created_at, d.error, d.dead_lettered_at,
           {{.S}}.wp_holds_stream(d.category, d.id, d.dead_letter_id)
      FROM {{.S}}.wp_dead_letters d
     WHERE d.dead_letter_id > COALESCE(p_after, 0)
       AND (p_category IS NULL OR d.category = p_category)
       AND (p_name IS NULL OR d.name = p_name)
       AND (p_stream IS NULL OR d.stream_id = p_stream)
       AND (p_error IS NULL OR strpos(lower(d.error), lower(p_error)) > 0)
       AND (p_since IS NULL OR d.dead_lettered_at >= p_since)
       AND (p_until IS NULL OR d.dead_lettered_at < p_until)
       AND (p_ids IS NULL OR d.id = ANY (p_ids))
     ORDER BY d.dead_letter_id
     LIMIT p_limit
$fn$;
