package migrations_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"sort"
	"testing"

	"github.com/workpump/workpump/migrations"
)

// released records the sha256 of every file of every released version.
// Databases in the field hold these versions and record only their
// numbers, so the files must never change: a change to the schema is a
// new version. Add a version's files here when it is released.
var released = map[string]string{
	"0001_tables.down.sql":                 "e333bd2d66ee15ed323fb59e16561d3eb0d662b3a75d8fce2a1ff0fc9c887a94",
	"0001_tables.up.sql":                   "355747b0c99c78e6fde80958b66c15570e8ca2dd398ebdb51a5701ab32564ade",
	"0002_functions.down.sql":              "ddaaeaf015530e9630e7d09e8f5901d3beb2af08ad824730eb3bb7029bfe4fa0",
	"0002_functions.up.sql":                "76f4d1ea77fcbfa4ba1cd5bdfd1db2f1e34282d33d5a8d5fafdbd094b0817a5f",
	"0003_claim_order.down.sql":            "c79d7361048113a600ab0117c5afcc9c80b81acd113fbc2f822b5e9c403431bf",
	"0003_claim_order.up.sql":              "ba66ae00416da8eac81b3e7d7de7a173d9914fd70d700327134a6b6ca006f4ab",
	"0004_liveness.down.sql":               "f2f31dc98374e42a57e84bceb3eb2b32af21e9076c91231ccbb803c0c22e6aa4",
	"0004_liveness.up.sql":                 "5349e5fdffff486e93874806b274c19781cecfe48003cd4893b1330de83c0ac7",
	"0005_partition_count.down.sql":        "46f9d9f16e6e0b3835676654d2936cef19c2129717dbf25074953086f456a774",
	"0005_partition_count.up.sql":          "89a66e9fc479e5c3baf47bb45d33d4404277180d447fa448d8381ab858be3c35",
	"0006_lease_fences.down.sql":           "800a06ea5f9da2adeec63727d01bf112b440bf314ae6bc9f0f1d51e37191fed4",
	"0006_lease_fences.up.sql":             "25a423c6804c6f60626952f2c3aa081918ef724e5e4f6c5283513c30509715f5",
	"0007_named_parts.down.sql":            "a4340a8b5d68e53e948439668cd7e5c9d2bbf3d5f1e5c3d70ced400bf2e7a5db",
	"0007_named_parts.up.sql":              "ba4e71df3cf5e0f9336e97632f1e7962db7cf2abf43555e0d762fbf43a990524",
	"0008_wakeup_pauses.down.sql":          "e315c4620217b07543925f0ff6a8b0c8848ae02e90359d93704ed425b15231fa",
	"0008_wakeup_pauses.up.sql":            "ecce3f1326f9f3ef1c2a748d01fe7fe765a5f8251bc2c7d6e9d8b7eeb6617795",
	"0009_dead_letter_ops.down.sql":        "412bc41799fa84401d20d1140846e8073daac23ba51b4b7eba3c895c80ff17a2",
	"0009_dead_letter_ops.up.sql":          "46116448e3ab38ed2ac73884681341d79d6b3827d1fe3c6e3105e058dd83ce08",
	"0010_outcomes_and_holds.down.sql":     "b621c928efbe32c35b8812d75f9da02ab98c6f4c24723bacabbf8a8c27c921f3",
	"0010_outcomes_and_holds.up.sql":       "66f32d64382ca65e324256bd8bc32dc33a0a9a75d07ceb138aae520815945d46",
	"0011_cancel.down.sql":                 "e79a03776ba2651e9a560ade46c39960227787186e0ce8e925d2da7a85bb70ac",
	"0011_cancel.up.sql":                   "f2be5523f3bc6aa6183436ad8872a931d797cef27d77ac2904faa575056db793",
	"0012_dead_letter_holds.down.sql":      "b47b2e1c28b9d899ab45e7f71b38194fb1dd5a28620cbaba1e39281b81302992",
	"0012_dead_letter_holds.up.sql":        "ad6ae63883ab4211253cc8fbf2d17d714e4d201d147722e709865cff0992a9fd",
	"0013_pauses.down.sql":                 "223a6f11d9de75ac97f78f81261d0f9e6bb3dad1990f54677fd5a30c7f94a244",
	"0013_pauses.up.sql":                   "8f766227908ff7aba4db4dcc1af9cdedae781649fd8a7ddf6dc3e3502f4f1701",
	"0014_lock_order.down.sql":             "dd57b34428260ecdedc7f06772e510357c29bbcaf1fd0474f5d64e4f17699978",
	"0014_lock_order.up.sql":               "faeced8319fda893440c07eb4a052a65014945177aba66934efd58338cd06dd9",
	"0015_rank_residues.down.sql":          "ac7d7d6e1677b5985bdd0f63430a1472575a838d982c4431aed2d95705c7a5d2",
	"0015_rank_residues.up.sql":            "3f263acdb592bc96c6da12f906019b0155dbf429d48e74e6989f8a90b0746ff2",
	"0016_bounded_reads.down.sql":          "45a34e05d5d3b8a613dc76b952775fe276f88cee94f87ddcbf68974418a9513c",
	"0016_bounded_reads.up.sql":            "7d2b95672d6db9e7d4ad42af699378206757ccae0c6370d9034c83eaf7ff92b8",
	"0017_leased_index.down.sql":           "41d2e1e68174cff58458a6ff7faf31bf2b1064d58bbf3e8899610a730fd8865d",
	"0017_leased_index.up.sql":             "a5ff089142c4198d86d0ce07c3cdb834d45a652ba65c5cb19dceaaf44fdfd9a1",
	"0018_key_ranges.down.sql":             "cc415c6baffafc69d4ec380eb5d6d1a3673440102230036bbec5ed2ea10222d6",
	"0018_key_ranges.up.sql":               "7b1777522ee4114e3c962da93eabb5a9daaa9c26d57be7f1fcc4c0c5ba821094",
	"0019_lean_claims.down.sql":            "5983222f93cdef5c25a2934eb320ae3469324ddb2c60cff8742b849902a9be53",
	"0019_lean_claims.up.sql":              "b18cc34654bc77c4e4a13f4a11f7f61fe56188c13cb6a2ad8f28fcd3cc13b98b",
	"0020_wake_owner.down.sql":             "cb0c21f2b952727970281835cd4257115b3ea83569f74115b1a2f1325ab184ba",
	"0020_wake_owner.up.sql":               "d056795c0e209d8e763027990953867b90a4888a0575f4251af67df2de27726f",
	"0021_join_free_writes.down.sql":       "b742fe80c962b74cc11fdb1dcd851542095977c28449feba2742f901df528139",
	"0021_join_free_writes.up.sql":         "80712b96f09f7618ee998a4044d1b36a23b0890ef4120d0a66047184d72727c7",
	"0022_dead_letter_lock_order.down.sql": "ebe552ea2d64d179a3ee76468190896a88c7c0fda8507725e528f59c1f972cac",
	"0022_dead_letter_lock_order.up.sql":   "d57766846a1e6533664c9e8776648148f12a22035337b8fafd279c91efd57a07",
}

// TestReleasedMigrationsAreFrozen fails, naming the file, when a released
// migration file is edited or removed, or a released version gains a file.
func TestReleasedMigrationsAreFrozen(t *testing.T) {
	names := make([]string, 0, len(released))
	newest := ""
	for name := range released {
		names = append(names, name)
		newest = max(newest, name[:4])
	}
	sort.Strings(names)
	ents, err := fs.ReadDir(migrations.FS(), ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if _, ok := released[e.Name()]; !ok && e.Name()[:4] <= newest {
			t.Errorf("sql/%s is not part of any released version, but its number is not above the newest released version %s: add a new version instead", e.Name(), newest)
		}
	}
	for _, name := range names {
		b, err := fs.ReadFile(migrations.FS(), name)
		if err != nil {
			t.Errorf("released migration sql/%s is gone (%v): released versions stay; add a new version instead", name, err)
			continue
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != released[name] {
			t.Errorf("released migration sql/%s was edited (sha256 %s, released as %s): databases already hold this version and record only its number, "+
				"so restore the file and put the change in a new version, %04d_<name>.up.sql and .down.sql", name, got, released[name], migrations.Latest()+1)
		}
	}
}
