package migrations

// LockKeyText is the text whose hashtextextended(text, 0) is the advisory
// lock key that serialises migrators of schema. Migration runners outside
// this package (bundriver's bun/migrate registration) take the same lock,
// as a transaction-level pg_advisory_xact_lock, so they never interleave
// with Up or Down on the same schema.
func LockKeyText(schema string) string { return lockKeyText(schema) }
