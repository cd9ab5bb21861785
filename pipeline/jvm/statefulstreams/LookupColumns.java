package statefulstreams;

import java.io.Serializable;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.StructType;

import statefulstreams.Rows.Field;

/** A {@link LookupSpec}'s columns found in the lookup's row schema (input, output and waiting rows share it). */
final class LookupColumns implements Serializable {
  private static final long serialVersionUID = 1L;
  final StructType schema;
  /** The state columns alone: a key's record. */
  final StructType stateSchema;
  final Field key, role, found, firstSeen, waited;
  final Field[] state, order;

  LookupColumns(StructType schema, LookupSpec spec) {
    this.schema = schema;
    this.key = new Field(schema, spec.key);
    this.role = new Field(schema, spec.role);
    this.found = new Field(schema, spec.found);
    this.firstSeen = new Field(schema, spec.firstSeen);
    this.waited = new Field(schema, spec.waited);
    this.state = Field.all(schema, spec.state);
    this.order = Field.all(schema, spec.readOrder);
    this.stateSchema = Rows.schemaOf(schema, state);
  }

  LookupRole roleOf(Row row) {
    return LookupRole.of(role.getString(row));
  }
}
